"""One cell's build as a page: per attempt, the objects on a timeline (which ran when, with the
plan's prediction beside each; whether the longest started first or ended the build alone) and
the memory the compilers held against the predicted peak and the cap.

Drawn from what the build wrote: the sampler's events beside each attempt's log (objects by
their ``-o`` as they start and end, memory samples: runners/inside/sampling.py) or, for a runner
without the sampler, the build tree's ``.ninja_log``; the plan of each attempt; its outcome.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from factory.planning.ninja_log import LoggedObject
from factory.reports.compile_events import CompileEvents
from factory.reports.page import COLORS, Frame, esc, legend, nice_ticks, page
from factory.units import GIB, format_duration, format_size

ROW = 11  # pixels per object on the timeline
WIDTH = 1100


@dataclasses.dataclass(frozen=True)
class Sample:
    t: float  # seconds since the attempt began
    rss: int  # the compilers' RSS summed (the sampler's process tree)
    anon: int | None  # the cgroup's anonymous memory, where it could be read


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttemptPicture:
    number: int
    jobs: int
    threads: int
    cap_bytes: int | None
    predicted_peak_bytes: int | None
    predicted_seconds: float | None
    outcome: str  # "built", "OOM-killed", "failed (exit 1)"
    objects: tuple[LoggedObject, ...] = ()  # seconds since the attempt began
    samples: tuple[Sample, ...] = ()
    predicted: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # what ``samples[].rss`` measures (a run without the sampler may have the host's figure)
    memory_label: str = "compilers' RSS (sampled)"

    @property
    def span(self) -> float:
        ends = [o.end for o in self.objects] + [s.t for s in self.samples]
        return max(ends, default=0.0)

    @property
    def compile_span(self) -> float:
        if not self.objects:
            return 0.0
        return max(o.end for o in self.objects) - min(o.start for o in self.objects)

    @property
    def peak_rss(self) -> int:
        return max((s.rss for s in self.samples), default=0)

    @property
    def peak_anon(self) -> int | None:
        values = [s.anon for s in self.samples if s.anon is not None]
        return max(values) if values else None


def read_events(path: Path, objects: Iterable[str] = ()) -> tuple[tuple[LoggedObject, ...],
                                                                   tuple[Sample, ...]]:
    """The sampler's events file as (objects, memory samples), times from its first line.
    ``objects``: the build's object keys, by which a compile cache's stages find their object
    (reports.compile_events)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return (), ()
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("t"), (int, float)):
            events.append(event)
    if not events:
        return (), ()
    t0 = min(float(e["t"]) for e in events)
    compiles = CompileEvents(objects)
    samples: list[Sample] = []
    for e in events:
        compiles.feed(e)
        if "rss" in e:
            anon = e.get("anon")
            samples.append(Sample(float(e["t"]) - t0, int(e["rss"] or 0),
                                  int(anon) if anon is not None else None))
    found = [LoggedObject(key=key, start=start - t0, end=end - t0)
             for key, (start, end) in compiles.finished.items()]
    found.sort(key=lambda o: (o.start, o.key))
    return tuple(found), tuple(samples)


def _short(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def time_span(attempt: AttemptPicture) -> float:
    """The time axis both charts of an attempt share: to its last event or planned end."""
    planned = [o.start + attempt.predicted.get(o.key, 0.0) for o in attempt.objects]
    return max([attempt.span, *planned, 1.0]) * 1.02


def timeline_svg(attempt: AttemptPicture) -> str:
    objects = attempt.objects
    frame = Frame(width=WIDTH, height=max(80, len(objects) * ROW + 46), x_max=time_span(attempt),
                  y_max=max(1, len(objects)), left=230)
    longest = sorted((o.end - o.start for o in objects), reverse=True)
    cut = longest[max(0, len(longest) // 10 - 1)] if longest else 0.0
    for i, o in enumerate(objects):
        y = frame.row_y(i) + 1
        seconds = o.end - o.start
        color = COLORS["long"] if seconds >= cut else COLORS["object"]
        predicted = attempt.predicted.get(o.key)
        tip = f"{o.key}: {seconds:.0f} s" + (f" (predicted {predicted:.0f} s)" if predicted else "")
        if predicted:
            frame.add(f'<rect x="{frame.x(o.start):.1f}" y="{y:.1f}" '
                      f'width="{frame.x(o.start + predicted) - frame.x(o.start):.1f}" '
                      f'height="{ROW - 2}" fill="none" stroke="{COLORS["predicted"]}" '
                      f'stroke-width="1" class="predicted"/>')
        frame.add(f'<rect class="object" x="{frame.x(o.start):.1f}" y="{y + 1.5:.1f}" '
                  f'width="{max(1.0, frame.x(o.end) - frame.x(o.start)):.1f}" '
                  f'height="{ROW - 5}" fill="{color}"><title>{esc(tip)}</title></rect>')
        frame.add(f'<text x="{frame.left - 6}" y="{y + ROW - 3:.1f}" text-anchor="end" '
                  f'font-size="9">{esc(_short(o.key))}</text>')
    frame.time_axis("since the attempt began")
    return frame.svg(f"attempt {attempt.number}: {len(objects)} objects over time")


def memory_svg(attempt: AttemptPicture) -> str:
    samples = attempt.samples
    top = max([1, *(s.rss for s in samples), *(s.anon or 0 for s in samples),
               attempt.cap_bytes or 0, attempt.predicted_peak_bytes or 0]) * 1.08
    frame = Frame(width=WIDTH, height=300, x_max=time_span(attempt), y_max=top / GIB, left=230)
    frame.value_axis(nice_ticks(top / GIB), "{:g}", "GiB")
    frame.time_axis("since the attempt began")

    def line(points: Iterable[tuple[float, float]], color: str, cls: str) -> None:
        pts = " ".join(f"{frame.x(t):.1f},{frame.y(v / GIB):.1f}" for t, v in points)
        if pts:
            frame.add(f'<polyline class="{cls}" points="{pts}" fill="none" stroke="{color}" '
                      f'stroke-width="1.6"/>')

    line(((s.t, s.rss) for s in samples), COLORS["rss"], "rss")
    line(((s.t, s.anon) for s in samples if s.anon is not None), COLORS["anon"], "anon")
    # the cap's label at the right end of its line, the prediction's at the left: close
    # values never print over each other
    for value, color, name, dash, x, anchor in (
            (attempt.predicted_peak_bytes, COLORS["predicted"], "predicted peak", "6 4",
             frame.left + 4, "start"),
            (attempt.cap_bytes, COLORS["cap"], "memory cap", "", frame.left + frame.inner_w - 4,
             "end")):
        if value:
            y = frame.y(value / GIB)
            frame.add(f'<line class="{name.replace(" ", "-")}" x1="{frame.left}" y1="{y:.1f}" '
                      f'x2="{frame.left + frame.inner_w:.1f}" y2="{y:.1f}" stroke="{color}" '
                      f'stroke-width="1.4" stroke-dasharray="{dash}"/>'
                      f'<text x="{x:.1f}" y="{y - 4:.1f}" text-anchor="{anchor}">'
                      f"{esc(name)} {format_size(value)}</text>")
    return frame.svg(f"attempt {attempt.number}: memory over time")


def _facts(attempts: Sequence[AttemptPicture]) -> str:
    head = ("attempt", "jobs x threads", "memory cap", "predicted peak", "compilers' peak",
            "cgroup anon peak", "predicted compile", "compile span", "objects", "outcome")
    rows = ["<tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for a in attempts:
        cells = [str(a.number), f"{a.jobs} x {a.threads}",
                 format_size(a.cap_bytes) if a.cap_bytes else "none",
                 format_size(a.predicted_peak_bytes) if a.predicted_peak_bytes else "-",
                 format_size(a.peak_rss) if a.samples else "-",
                 format_size(a.peak_anon) if a.peak_anon is not None else "-",
                 format_duration(a.predicted_seconds) if a.predicted_seconds else "-",
                 format_duration(a.compile_span) if a.objects else "-",
                 str(len(a.objects)), a.outcome]
        rows.append("<tr>" + "".join(
            f'<td class="n">{esc(c)}</td>' if i and i < 9 else f"<td>{esc(c)}</td>"
            for i, c in enumerate(cells)) + "</tr>")
    return '<table class="facts">' + "".join(rows) + "</table>"


def build_report_html(*, cell_id: str, attempts: Sequence[AttemptPicture],
                      wheel: str | None = None, note: str = "") -> str:
    body = [f"<h1>Build of <code>{esc(cell_id)}</code></h1>",
            f'<p class="sub">{len(attempts)} attempt(s)'
            + (f"; wheel <code>{esc(wheel)}</code>" if wheel else "")
            + (f"; {esc(note)}" if note else "") + "</p>", _facts(attempts)]
    for a in attempts:
        body.append(f'<section id="attempt-{a.number}"><h2>Attempt {a.number}: {a.jobs} job(s) '
                    f"x {a.threads} nvcc thread(s), {esc(a.outcome)}</h2>")
        if a.objects:
            body.append(legend([("object (compile job)", COLORS["object"]),
                                ("longest tenth", COLORS["long"])]
                               + ([("planned seconds", COLORS["predicted"])]
                                  if a.predicted else [])))
            body.append(f'<div class="scroll timeline">{timeline_svg(a)}</div>')
        else:
            body.append("<p>No object finished in this attempt.</p>")
        if a.samples:
            items = [(a.memory_label, COLORS["rss"])]
            if a.peak_anon is not None:
                items.append(("cgroup anonymous memory", COLORS["anon"]))
            if a.predicted_peak_bytes:
                items.append(("predicted peak", COLORS["predicted"]))
            if a.cap_bytes:
                items.append(("memory cap", COLORS["cap"]))
            body.append(legend(items))
            body.append(f'<div class="scroll memory">{memory_svg(a)}</div>')
        body.append("</section>")
    return page(f"build {cell_id}", body)
