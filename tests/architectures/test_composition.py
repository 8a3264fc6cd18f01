from mtt.architectures.testing import ArchitectureTests


class TestComposition(ArchitectureTests):
    name = "composition"
