"""A user module that defines a policy but forgot the decorator (a common porting mistake)."""

from tests.policy.toy import ToyPolicy


class Forgotten(ToyPolicy):
    pass
