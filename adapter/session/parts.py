"""The named parts of one session, held together: what each part and the profile's extension
reach of the others.

Pure.  ``Parts`` owns no state of its own beyond the identity (set once, at login): every other
field is a part that owns its piece of the connection's state (adapter/session/core.py lists
them).  The session builds it once; the extension (adapter/session/activemq.py) reads the parts
through it by their public names instead of the session's private attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..mapping.profile import RabbitMQRules
    from .confirms import Confirms
    from .edition import Edition
    from .extension import ProfileExtension
    from .frames import Frames
    from .login import Identity, Login
    from .publishing import Publishing
    from .retries import Retries
    from .settings import SessionSettings
    from .subscription import Subscription
    from .subscriptions import Subscriptions
    from .targets import Targets
    from .transactions import Transactions


class Parts:
    """One session's parts (see the module docstring).  The extension and the two parts built
    with it (``Subscriptions``, ``Publishing``) are set right after the others, since they take
    the extension; nothing reads them before the session's constructor returns."""

    __slots__ = (
        "by_tag",
        "confirms",
        "edition",
        "extension",
        "frames",
        "logged_in",
        "login",
        "publishing",
        "retries",
        "rules",
        "settings",
        "subscriptions",
        "targets",
        "transactions",
    )

    extension: ProfileExtension
    subscriptions: Subscriptions
    publishing: Publishing

    def __init__(
        self,
        settings: SessionSettings,
        rules: RabbitMQRules,
        edition: Edition,
        login: Login,
        by_tag: dict[str, Subscription],
        frames: Frames,
        confirms: Confirms,
        transactions: Transactions,
        targets: Targets,
        retries: Retries,
    ) -> None:
        self.settings = settings
        self.rules = rules
        self.edition = edition  # whose visible behaviour (adapter/session/edition.py)
        self.login = login
        self.by_tag = by_tag  # consumer tag -> subscription, shared by the parts
        self.frames = frames
        self.confirms = confirms
        self.transactions = transactions
        self.targets = targets
        self.retries = retries
        self.logged_in: Identity | None = None  # set once, by the session, at login

    @property
    def identity(self) -> Identity:
        """Who the connection is logged in as; only asked once it is."""
        assert self.logged_in is not None, "not logged in"
        return self.logged_in
