"""Plain jax.numpy workloads, written the way a user would, that shardprop shards automatically."""
