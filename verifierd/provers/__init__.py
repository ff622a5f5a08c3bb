"""Provers as first-class objects: per-prover verdict statistics, the sequential test and alarms.

A *prover* is one server address and port as one collector sees it (``ProverKey``). Every
verdict the store writes updates its prover's statistics, sequential test and alarms in the
same LMDB transaction (:class:`verifierd.provers.store.ProverTables`), so a crash can neither
lose nor double-count one.
"""
