"""Generated protobuf and gRPC modules for veritap.v1 (run `make proto`)."""
