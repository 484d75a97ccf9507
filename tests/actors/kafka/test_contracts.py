"""Every Kafka adapter satisfies its contract (``actors.kafka.contracts``): each method the
Protocol declares exists on the adapter class with the same parameters, so a caller written
against the contract works with either library."""

from __future__ import annotations

import inspect

import pytest

from actors.kafka import contracts
from actors.kafka.consumers import KafkaPythonReader, RdkafkaReader
from actors.kafka.kafka_python import KafkaPythonClient
from actors.kafka.librdkafka import RdKafkaClient
from actors.kafka.transactional import TransactionalClient


def members(protocol) -> dict:
    """The methods a Protocol declares (its own and inherited), name -> function."""
    out = {}
    for cls in reversed(protocol.__mro__):
        if cls in (object,) or not getattr(cls, "_is_protocol", False):
            continue
        for name, value in vars(cls).items():
            if not name.startswith("_") and (inspect.isfunction(value)
                                             or isinstance(value, property)):
                out[name] = value
    return out


def params(fn) -> list[tuple[str, object]]:
    if isinstance(fn, property):
        return []
    sig = inspect.signature(fn)
    return [(p.name, p.default) for p in sig.parameters.values() if p.name != "self"]


@pytest.mark.parametrize("protocol, adapter", [
    (contracts.Producer, KafkaPythonClient),
    (contracts.Producer, RdKafkaClient),
    (contracts.InlineProducer, RdKafkaClient),
    (contracts.PackedProducer, RdKafkaClient),
    (contracts.TransactionalProducer, TransactionalClient),
    (contracts.Consumer, KafkaPythonReader),
    (contracts.Consumer, RdkafkaReader),
], ids=lambda x: x.__name__)
def test_the_adapter_has_every_method_of_its_contract(protocol, adapter):
    declared = members(protocol)
    assert declared, protocol
    for name, fn in declared.items():
        found = inspect.getattr_static(adapter, name, None)
        assert found is not None, f"{adapter.__name__} lacks {name}"
        # a contract the adapter names as its base lends it the Protocol's empty method
        assert found is not fn, f"{adapter.__name__} lacks {name} (only the contract's)"
        if isinstance(fn, property):
            assert isinstance(found, property), f"{adapter.__name__}.{name} is no property"
            continue
        if isinstance(found, staticmethod):  # a module function serving as the method
            found = found.__func__
        assert params(fn) == params(found)[:len(params(fn))], (adapter.__name__, name)
        extra = params(found)[len(params(fn)):]
        assert all(d is not inspect.Parameter.empty for _, d in extra), (adapter.__name__,
                                                                         name, extra)


def test_a_class_missing_a_method_breaks_the_contract():
    class Partial:
        def produce(self, records, ticket, on_done):
            pass

    with pytest.raises(AssertionError):
        test_the_adapter_has_every_method_of_its_contract(contracts.Producer, Partial)


def test_a_class_naming_a_contract_still_writes_its_methods():
    class Named(contracts.Producer):
        def produce(self, records, ticket, on_done):
            pass

    with pytest.raises(AssertionError, match="only the contract's"):
        test_the_adapter_has_every_method_of_its_contract(contracts.Producer, Named)


@pytest.mark.parametrize("adapter, capabilities", [
    (KafkaPythonClient, set()),
    (RdKafkaClient, {contracts.InlineProducer, contracts.PackedProducer}),
    (TransactionalClient, {contracts.TransactionalProducer}),
], ids=lambda x: getattr(x, "__name__", ""))
def test_each_client_states_its_capabilities_as_contracts(adapter, capabilities):
    """The sink and the initial snapshot ask a client for a capability by its contract
    (``isinstance``), so each client names the contracts it has as its bases."""
    named = {c for c in (contracts.InlineProducer, contracts.PackedProducer,
                         contracts.TransactionalProducer) if c in adapter.__mro__}
    assert named == capabilities
    assert contracts.Producer in adapter.__mro__
