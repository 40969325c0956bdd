"""Where the fork builds its draft runners: from its EAGLE worker, as SGLang builds its own."""

from eagle_fork.draft_runners import BoundedDraftRunner, CountingDraftExtendRunner


def build_draft_runners(eagle_worker):
    """The draft runner and the draft-extend runner of ``eagle_worker``, captured."""
    return BoundedDraftRunner(eagle_worker), CountingDraftExtendRunner(eagle_worker)
