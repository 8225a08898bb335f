"""In-repo fakes that obey a real component's contract, for tests (see each module's docstring)."""
