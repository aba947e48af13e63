"""Wire protocols: pure parsers and encoders, one module per protocol, no I/O."""
