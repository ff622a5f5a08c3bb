"""The veritap contract: generated protobuf modules and the envelope code both daemons share."""
