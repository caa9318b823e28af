"""The consumer's activities, one module each, all handed one :class:`~lbs._consumer.state.ClientState`.

:class:`lbs.Client` builds them and is their only caller from outside; none
of them knows the Client. See docs/ARCHITECTURE.md for how one assignment
flows through them.
"""
