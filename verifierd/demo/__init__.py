"""`make demo`: the whole pair live on loopback, catching a dishonest prover."""
