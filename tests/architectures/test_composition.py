from mtt.testing import ArchitectureTests


class TestComposition(ArchitectureTests):
    name = "composition"


def test_a_subclass_that_overrides_per_atom_outputs_is_trained_through_it():
    """Flat batches would bypass an override of ``per_atom_outputs``: it turns them off,
    unless the subclass overrides ``per_atom_outputs_of_batch`` too."""
    from mtt.architectures.composition import CompositionModel
    from mtt.architectures.soap_bpnn.model import SoapBpnn

    class Overrides(CompositionModel):
        def per_atom_outputs(self, systems):
            return super().per_atom_outputs(systems)

    class OverridesBoth(Overrides):
        def per_atom_outputs_of_batch(self, batch):
            return super().per_atom_outputs_of_batch(batch)

    assert CompositionModel.uses_flat_batches() and SoapBpnn.uses_flat_batches()
    assert not Overrides.uses_flat_batches()
    assert OverridesBoth.uses_flat_batches()
