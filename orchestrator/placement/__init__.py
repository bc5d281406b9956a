"""Placement: where each role's actors run and how the step shares devices.

- plan.py: the placement plan (pure): groups, bundles, slots and pinned cores per `placement.mode`.
- groups.py: gang reservation of the plan's placement groups (Ray); `PlacementError` names what is missing.
- modes.py: what a mode changes in the step (colocated: engines sleep while the trainer trains).
- replace.py: `placement.auto`, re-placing the actors after the warm-up steps on the sizer's advice.

Nothing is imported here, so that the pure modules (plan, replace's `decide`) load without Ray.
"""
