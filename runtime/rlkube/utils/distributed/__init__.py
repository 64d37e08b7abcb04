"""RLightning's ``rlightning.utils.distributed``: the train ranks' process group, by RLightning's names.

rlkube sets up one torch.distributed group per job, over its train ranks (gloo or NCCL, see
``spec.trainer.backend``): that group is RLightning's ``TRAIN_DATA_PARALLEL``. Eval workers are not
in it (they receive weights through the weight plane, not collectives).
"""
