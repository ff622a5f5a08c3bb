"""The collector's LedgerService: its log streamed to verifiers over gRPC.

`server.start_ledger_service` starts it in a running asyncio loop; `config` reads the
`[ledger]` section; `flow` (window and batching) and `retention` (acknowledged seqs per
verifier) are the parts without I/O; `subscription` and `service` are the gRPC shell.
"""
