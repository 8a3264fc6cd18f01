from mtt.architectures.testing import ArchitectureTests


class TestSoapBpnn(ArchitectureTests):
    name = "soap_bpnn"
    # small descriptor: the contract does not depend on its size
    hypers = {"soap": {"max_radial": 3, "max_angular": 2}}
