"""RLightning's ``rlightning.buffer`` import home, and the buffer processors an RLJob asks for.

* :mod:`~rlkube.buffer.processors`: ``spec.buffer.processors`` applied to each train rank's share
  before ``update_dataset`` (GAE advantages and returns, flattening to transitions).
* :mod:`~rlkube.buffer.utils.preprocessors` and :mod:`~rlkube.buffer.utils.utils`: RLightning's
  observation preprocessors and GAE helpers, by their names.

Pure: no I/O. The storage itself is rlkube's (:mod:`rlkube.data`): RLightning's ``DataBuffer``,
``RolloutBuffer`` and ``ReplayBuffer`` classes are chosen by ``spec.buffer.type`` instead.
"""
