"""Test servers and helpers every kind of test and bench/ share: the fake Compute Engine
(gcp.py) and ARM (azure.py) REST servers on one base (server.py), moto helpers (aws.py),
the fault-injecting proxy, the storage emulators, the price APIs, a scripted provider and
the rendezvous signing helpers."""
