"""One test module per public op: each native backend against the torch reference."""
