"""Cloud providers and storage backends against moto, the fake REST servers and the storage
emulators (tests/fakes/), the capacity suites and the conformance kit."""
