from mtt.testing import ArchitectureTests


class TestComposition(ArchitectureTests):
    name = "composition"
