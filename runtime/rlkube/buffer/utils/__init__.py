"""RLightning's ``rlightning.buffer.utils``: observation preprocessors and GAE helpers."""
