"""RLightning's ``rlightning.models.toy_model``: the test CNN over ``{"rgb", "state"}`` observations."""

from rlkube.models.toy_model.cnn import NatureCNN as NatureCNN

__all__ = ["NatureCNN"]
