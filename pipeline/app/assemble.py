"""What every way of starting the stack shares before anything runs: the topology over the product
catalog, and every stage's policy checked by its model.

1. `topology_for(settings)`: the settings' stages (or the product stages, in order), each resolved
   to its class through pipeline/stages/catalog.py unless the settings name one.
2. `check_policies(topology)`: each stage's `policy:` mapping validated by its policy model, a
   product stage's from its config.py (cheap to import), another's from its class; every error is
   reported at once, before a broker, a worker or a model starts.
"""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from pipeline.config.settings import Settings
from pipeline.runtime.errors import TopologyError
from pipeline.runtime.topology import Topology, import_object
from pipeline.stages.catalog import PRODUCT_STAGES, STAGE_CLASSES


def topology_for(settings: Settings) -> Topology:
    return Topology(settings, STAGE_CLASSES)


def policy_model(topology: Topology, name: str) -> type[BaseModel] | None:
    spec = topology.spec(name)
    if spec.cls is None and name in PRODUCT_STAGES:
        model = import_object(PRODUCT_STAGES[name].policy)
    else:
        model = topology.stage_class(name).policy_model
    if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TopologyError(f"stage {name!r}: its policy model {model!r} is not a pydantic model")
    return model


def check_policies(topology: Topology) -> None:
    """Raise one TopologyError naming every stage whose policy its model refuses, and why."""
    problems = []
    for name in topology.order:
        model = policy_model(topology, name)
        if model is None:
            continue
        try:
            model.model_validate(topology.spec(name).policy)
        except ValidationError as exc:
            errors = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(policy)'}: {e['msg']}" for e in exc.errors())
            problems.append(f"stage {name!r} policy: {errors}")
    if problems:
        raise TopologyError("the settings' stage policies are invalid (nothing was started):\n  "
                            + "\n  ".join(problems))
