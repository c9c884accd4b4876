"""Hardware and model catalog, and the step-time cost model of the simulator."""

from andante.perf.catalog import (
    get_hardware,
    get_model,
    hardware_names,
    model_names,
    save_hardware,
)
from andante.perf.cost_model import CostModel
from andante.perf.fit import fit_coefficients, prediction_error
from andante.perf.shape import BatchShape
from andante.perf.specs import CostCoefficients, HardwareSpec, ModelSpec

__all__ = [
    "BatchShape",
    "CostCoefficients",
    "CostModel",
    "HardwareSpec",
    "ModelSpec",
    "fit_coefficients",
    "get_hardware",
    "get_model",
    "hardware_names",
    "model_names",
    "prediction_error",
    "save_hardware",
]
