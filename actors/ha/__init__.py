"""High availability: standby routers coordinated by Kafka's group coordinator."""
