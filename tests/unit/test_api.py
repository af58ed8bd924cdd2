"""`import mpitrain` (mpitrain/__init__.py, mpitrain/api.py): the API's names load on first use, each one the
api module's own; a name it does not have is an AttributeError naming it; setup_logging's levels by rank. The
entry points' argument checks are tests/unit/test_arguments.py's."""
from __future__ import annotations

import logging

import pytest

import mpitrain
from mpitrain import api


def test_every_name_of_the_api_is_reached_through_the_package():
    assert len(api.__all__) == len(set(api.__all__)) > 30
    for name in api.__all__:
        assert getattr(mpitrain, name) is getattr(api, name), name
    assert mpitrain.THREADS.ranks_on_node >= 1  # the thread plan sized at import


def test_a_name_the_api_does_not_have_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'mpitrain' has no attribute 'Trainer'"):
        mpitrain.Trainer
    with pytest.raises(AttributeError, match="'_private'"):
        mpitrain._private


@pytest.mark.parametrize("rank, level", [(0, logging.INFO), (1, logging.WARNING)])
def test_setup_logging_gives_rank_0_info_and_the_others_warnings(rank, level):
    logger = logging.getLogger("mpitrain")
    before = logger.level
    try:
        api.setup_logging(rank)
        assert logger.level == level
    finally:
        logger.setLevel(before)
