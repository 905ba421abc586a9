"""The store's session events listen on the project's own sessions (`db.PlannerSession`, made by `session_factory`),
never on SQLAlchemy's `Session` class, whose listeners run for every session in the process, Prefect's included.

The events are the step templates' cache (`step_packing`): a transaction that inserted or read templates publishes
their ids to its connection's cache when it commits (`after_commit`) and forgets them when it rolls back."""

from __future__ import annotations

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from planner_core.domain import Component, ReasonCode, StepName, StepRecord
from planner_core.runtime.store import step_packing
from planner_core.runtime.store.db import PlannerSession, get_engine, session_factory


def _template() -> step_packing.StepTemplate:
    step = StepRecord(step=StepName.LOAD, reason=ReasonCode.SCALE_UP, component=Component.DECODE, detail="q 3 of 7")
    return step_packing.split_step(step).template


def test_the_listeners_are_on_the_projects_session_class_only() -> None:
    for name, listener in (("after_commit", step_packing._publish), ("after_soft_rollback", step_packing._forget)):
        assert event.contains(PlannerSession, name, listener)
        assert not event.contains(Session, name, listener)


def test_another_factorys_session_does_not_trigger_them_and_the_projects_does(database_url) -> None:
    template = _template()

    other = sessionmaker(bind=get_engine(database_url), expire_on_commit=False)  # another library's factory
    with other.begin() as session:
        assert not isinstance(session, PlannerSession)
        ids, _ = step_packing.template_ids(session, {template})
        connection_info = session.connection().info
    assert step_packing._CACHE not in connection_info  # `after_commit` did not run: nothing published
    assert session.info[step_packing._LEARNED]  # ... and what the transaction learned is still waiting

    ours = session_factory(database_url)
    with ours.begin() as session:
        assert isinstance(session, PlannerSession)
        assert step_packing.template_ids(session, {template})[0] == ids
        connection_info = session.connection().info
    assert connection_info[step_packing._CACHE].ids == ids  # published at commit
    assert step_packing._LEARNED not in session.info

    with ours() as session:
        session.begin()
        session.info[step_packing._LEARNED] = [({}, 0, {})]
        session.rollback()
        assert step_packing._LEARNED not in session.info  # `after_soft_rollback` forgot it
