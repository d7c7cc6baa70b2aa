"""The trainer's running totals and the log lines Kaldi's nnet3-train prints.

:class:`ObjectiveInfo` is Kaldi's ObjectiveFunctionInfo (per output node: totals,
and a summary line each time a phase of ``print-interval`` minibatches ends);
:class:`MaxChangeCounts` is MaxChangeStats (how often each max-change was
enforced). Numbers print as C++ streams print floats (6 significant digits).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _g(x: float) -> str:
    return f"{x:.6g}"


@dataclass
class ObjectiveInfo:
    """Totals of one output node (Kaldi's ObjectiveFunctionInfo)."""

    current_phase: int = 0
    minibatches_this_phase: int = 0
    tot_weight: float = 0.0
    tot_objf: float = 0.0
    tot_weight_this_phase: float = 0.0
    tot_objf_this_phase: float = 0.0

    def update(self, name: str, minibatches_per_phase: int, minibatch_counter: int,
               weight: float, objf: float) -> list[str]:
        """Add one minibatch; returns the phase summary line when a phase ended."""
        lines = []
        phase = minibatch_counter // minibatches_per_phase
        if phase != self.current_phase:
            lines.append(self._phase_line(name, minibatches_per_phase, phase))
            self.current_phase = phase
            self.tot_weight_this_phase = self.tot_objf_this_phase = 0.0
            self.minibatches_this_phase = 0
        self.minibatches_this_phase += 1
        self.tot_weight_this_phase += weight
        self.tot_objf_this_phase += objf
        self.tot_weight += weight
        self.tot_objf += objf
        return lines

    def _phase_line(self, name: str, per_phase: int, phase: int) -> str:
        start, end = self.current_phase * per_phase, phase * per_phase - 1
        avg = self.tot_objf_this_phase / self.tot_weight_this_phase \
            if self.tot_weight_this_phase else float("nan")
        if per_phase == self.minibatches_this_phase:
            return (f"Average objective function for '{name}' for minibatches {start}-{end} "
                    f"is {_g(avg)} over {_g(self.tot_weight_this_phase)} frames.")
        return (f"Average objective function for '{name} using "
                f"{self.minibatches_this_phase} minibatches in minibatch range {start}-{end} "
                f"is {_g(avg)} over {_g(self.tot_weight_this_phase)} frames.")

    def total_lines(self, name: str) -> list[str]:
        avg = self.tot_objf / self.tot_weight if self.tot_weight else float("nan")
        return [f"Overall average objective function for '{name}' is {_g(avg)} over "
                f"{_g(self.tot_weight)} frames.",
                f"[this line is to be parsed by a script:] log-prob-per-frame={_g(avg)}"]


@dataclass
class MaxChangeCounts:
    """How often max-change was enforced (Kaldi's MaxChangeStats)."""

    num_minibatches: int = 0
    per_component: dict[str, int] = field(default_factory=dict)
    num_global: int = 0

    def add(self, scales: dict[str, float], global_scale: float) -> None:
        self.num_minibatches += 1
        for name, s in scales.items():
            self.per_component[name] = self.per_component.get(name, 0) + (s < 1.0)
        self.num_global += global_scale < 1.0

    def lines(self) -> list[str]:
        out = [f"For {name}, per-component max-change was enforced "
               f"{_g(100.0 * n / self.num_minibatches)} % of the time."
               for name, n in self.per_component.items() if n > 0]
        if self.num_global > 0:
            out.append(f"The global max-change was enforced "
                       f"{_g(100.0 * self.num_global / self.num_minibatches)} % of the time.")
        return out
