"""RLightning's ``rlightning.models.vision``: ``NatureCNN``."""

from rlkube.models.vision.cnn import NatureCNN as NatureCNN

__all__ = ["NatureCNN"]
