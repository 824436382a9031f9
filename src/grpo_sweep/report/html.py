"""report.html: one self-contained page (inline CSS and JS, no CDN) next to its PNG figures.

The table sorts by any column on a click (numbers numerically); `#sort=<column>` in the URL sorts
on load, so a link can point at a sorted view. When the script has run it sets
`data-report-js="ready"` on <body> (and counts images that loaded), which the headless-browser
test reads back.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..study import best as best_rule
from ..study.attrs import ConfirmationState, Status
from ..units import MIB
from . import figures as figs
from .learning import Departure, key_of, verdict_lines
from .page_assets import CSS, JS
from .trials import (
    REPORT_FILE,
    Trial,
    budget_gib,
    learning_check,
    lever_effects,
    model_trust_line,
    model_vs_measured,
    overrides,
)
from .trials_table import _e, _fmt, reward_share_pct, trials_table


def effects_table(rows: list[dict], objective: str) -> str:
    if not rows:
        return '<p class="note">No lever took two values among the feasible trials.</p>'
    head = (
        f"<tr><th class=l>lever</th><th>from</th><th>to</th><th>peak memory</th><th>{_e(objective)}</th>"
        "<th class=l>measured on</th><th class=l>expected (levers.py)</th></tr>"
    )
    body = "".join(
        f"<tr><td class=l>{_e(r['lever'])}</td><td>{_e(r['low'])}</td><td>{_e(r['high'])}</td>"
        f'<td data-v="{_e(_fmt(r["peak_change_pct"]))}">{_fmt(r["peak_change_pct"])}%</td>'
        f'<td data-v="{_e(_fmt(r["objective_change_pct"]))}">{_fmt(r["objective_change_pct"])}%</td>'
        f"<td class=l>{_e(r['basis'])}</td><td class=l>{_e(r['expected'])}</td></tr>"
        for r in rows
    )
    return f'<table id="effects" class="sortable"><thead>{head}</thead><tbody>{body}</tbody></table>'


def reward_time_text(record: dict) -> str:
    """ "; reward functions 0.42 s per step (12.0% of the step)" when measured."""
    share = reward_share_pct(record)
    if share is None:
        return ""
    return f"; reward functions {record['reward_seconds_per_step']:.3g} s per step ({share:.1f}% of the step)"


def reward_text(record: dict) -> str:
    """The reward beside the throughput: "reward 0.70 (first 0.65 -> last 0.80, change +0.12)"."""
    mean = record.get("reward_mean")
    if not isinstance(mean, (int, float)) or not math.isfinite(mean):
        return "no reward logged"
    text = f"reward {mean:.3f}"
    first, last, change = (record.get(k) for k in ("reward_first", "reward_last", "reward_change"))
    if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (first, last)):
        text += f" (first step {first:.3f} -> last {last:.3f}"
        text += (
            f", last quarter - first quarter {change:+.3f})"
            if isinstance(change, (int, float)) and math.isfinite(change)
            else ")"
        )
    return text


def _figure(path: Path | None, alt: str, missing: str) -> str:
    """A figure's image, or a note in its place.

    Args:
        path: The PNG beside the page, or None when there is none.
        alt: The image's alternative text.
        missing: The note said when there is no figure.

    Returns:
        The HTML.
    """
    if path is None:
        return f'<p class="note">{_e(missing)}</p>'
    return f'<p><img src="{_e(path.name)}" alt="{_e(alt)}"></p>'


def finalists_html(ruling: best_rule.Verdict, objective: str, *, confirmed: bool, given_back: bool = False) -> str:
    """The Finalists: the configs the confirmation phase compared (hydra.sweeper.confirm_top), the
    winner first, each with its runs, median and spread, and whether the winner is separated from the
    others at the noise the study measured, or ties with them (and then why it won the tie). Without a
    confirmation phase, a note saying so and what the winner rests on.

    Args:
        ruling: The best rule's verdict, the configs ranked.
        objective: The objective's name.
        confirmed: Whether a confirmation phase ran.
        given_back: Confirmation chose finalists, but the noise was beyond what its budget could settle,
            so it ran none and gave its runs to the search.

    Returns:
        The section's HTML.
    """
    ranked = ruling.ranked
    if not ranked:
        return ""
    tie = tie_html(ruling)
    if not confirmed:
        winner = ranked[0]
        runs = len(winner.runs)
        repeated = [f for f in ranked if len(f.runs) > 1 and f is not winner]
        also = "".join(f" {_e(f.item.name)} ran {len(f.runs)} times (its median counted)." for f in repeated)
        why = (
            "confirmation found the measured noise beyond what its budget could settle, or no run within its "
            "budget, and gave its runs to the search"
            if given_back
            else "hydra.sweeper.confirm_top is 0, or the sweep had too few trials for one"
        )
        return (
            f"<p id=finalists-note>No confirmation runs were made ({why}): every config competed on the median of "
            "its own runs, and the winner, "
            f"{_e(winner.item.name)}, rests on {runs} run{'s' if runs > 1 else ''}.{also}</p>{tie}"
        )
    rows = []
    for f in ranked:
        runs = ", ".join(f"{v:.1f}" for v in f.runs)
        spread = f"{f.spread:.0%}" if f.spread is not None else "-"
        rows.append(f"<tr><td class=l>{_e(f.item.name)}</td><td>{f.median:.1f}</td><td class=l>{runs}</td><td>{spread}</td></tr>")
    note = ""
    if (
        not ruling.tie
        and len(ruling.by_median) >= 2
        and best_rule.within_noise(ruling.by_median[0], ruling.by_median[1], ruling.sigma) is False
    ):
        note = (
            f"<p id=noise-note>The winner is separated from the runner-up at the noise this study measured "
            f"({ruling.sigma:.1%} of a run): a clear winner on this machine.</p>"
        )
    elif ruling.sigma is None:
        note = "<p id=noise-note>No config ran twice: this study measured no noise, so no lead is known to be real.</p>"
    return (
        f"<h3>Finalists: the configs confirmation compared (the best median of {_e(objective)} wins)</h3>"
        "<table id=finalists><thead><tr>"
        "<th class=l>config (first run)</th><th>median</th><th class=l>runs</th><th>spread</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>{note}{tie}"
    )


def confirmation_html(stored: dict) -> str:
    """What the sweeper's confirmation rounds spent and why they stopped (its study attr Key.CONFIRMATION)."""
    state = ConfirmationState.from_dict(stored)
    if state is None or not state.stopped:
        return ""
    sweep_s = state.sweep_s or 0.0
    share = f", {state.spent_s:.0f} s of the sweep's {sweep_s:.0f} s" if sweep_s else ""
    return (
        f"<p id=confirmation-note>Confirmation: {len(state.runs)} runs in {state.rounds} "
        f"rounds{share}; stopped: {_e(state.why)}.</p>"
    )


def tie_html(ruling: best_rule.Verdict) -> str:
    """A tie within noise: the configs, their medians and headroom, and the winner's reason."""
    if not ruling.tie:
        return ""
    rows = []
    for f in ruling.tie:
        peak, share = ruling.memory(f)
        room = f"{1 - share:.0%}" if share is not None else "-"
        mark = " (wins)" if f is ruling.winner else ""
        rows.append(
            f"<tr><td class=l>{_e(f.item.name)}{mark}</td><td>{f.median:.1f}</td><td>{len(f.runs)}</td>"
            f"<td>{_mib(peak)}</td><td>{room}</td></tr>"
        )
    return (
        f"<p id=tie-note>Tie: {', '.join(_e(f.item.name) for f in ruling.tie)} are within each other's noise "
        f"({f'{ruling.sigma:.1%} of a run, measured on this study' if ruling.sigma is not None else 'no noise measured yet'}): "
        "none is faster as far as this machine can tell. "
        f"{_tie_winner(ruling)}</p>"
        "<table id=tie><thead><tr><th class=l>config</th><th>median</th><th>runs</th><th>peak MiB</th>"
        f"<th>headroom</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _tie_winner(ruling: best_rule.Verdict) -> str:
    """How the tie was settled (grpo_sweep.study.best.decide): by headroom among the configs shown within
    best.INDIFFERENCE of the leader, else by the best median."""
    zone = f"{ruling.zone:.0%}"
    name = _e(ruling.winner.item.name)
    if not ruling.close:
        return (
            f"None is shown within {zone} of the leader, so {name} wins the tie with the best median "
            "(more runs could tell them apart)."
        )
    return (
        f"{', '.join(_e(f.item.name) for f in ruling.close)} are within {zone} of each other: {name} wins the tie "
        "with the most memory headroom, the safer config for a long run."
    )


def soak_warning_html(soak: dict | None) -> str:
    """The line that flags the winner when its soak ran out of memory, passed the budget or grew
    (the sweeper's soak.warning, recorded with the soak); empty otherwise."""
    if not soak or not soak.get("warning"):
        return ""
    return f"<p id=soak-warning class=warn><b>Not recommended as it is:</b> {_e(soak['warning'])}.</p>"


def soak_html(soak: dict) -> str:
    """The Soak section: the winner run hydra.sweeper.soak_steps more steps (the sweeper's soak.py),
    whether its peak grew over them, and every step's own peak."""

    def _mib1(n) -> str:  # a tiny model's step peaks differ by tenths of a MiB
        return f"{n / MIB:.1f}" if isinstance(n, (int, float)) else "-"

    asked = f" of {_e(soak['steps_asked'])}" if soak.get("steps_asked") and soak.get("steps") is not None else ""
    ran = soak.get("steps") if soak.get("steps") is not None else soak.get("steps_asked")
    head = f"trial {_e(soak.get('trial'))}'s config, {_e(ran)}{asked} steps"
    warn = soak_warning_html(soak)
    if soak.get("status") == Status.RUNNING:
        return f"<p id=soak-note>Soak of {head}: running in worker {_e(soak.get('worker'))}; its verdict comes when it ends.</p>"
    if soak.get("status") == Status.INTERRUPTED:
        return (
            f"<p id=soak-note>Soak of {head}: interrupted ({_e(soak.get('error'))}), no verdict. Resume it with:</p>"
            f"<pre id=soak-resume>{_e(soak.get('resume') or 'the sweep command, run again')}</pre>"
        )
    if soak.get("status") != Status.OK:
        return f"<p id=soak-note>Soak of {head}: {_e(soak.get('status'))} ({_e(soak.get('error') or 'no record')}).</p>{warn}"
    if soak.get("grew") is None:
        return f"<p id=soak-note>Soak of {head}: {_e(soak.get('why'))}.</p>{warn}"
    verdict = "Memory grew" if soak["grew"] else "Memory held"
    highest = soak.get("highest_peak_bytes", soak["last_peak_bytes"])
    note = (
        f"<p id=soak-note>Soak of {head}: <b>{verdict}</b>. Step {_e(soak['first_timed_step'])} peaked at "
        f"{_mib1(soak['first_peak_bytes'])} MiB, the highest step (step {_e(soak.get('highest_step'))}) at "
        f"{_mib1(highest)} MiB, the last steps at {_mib1(soak['last_peak_bytes'])} MiB; trend "
        f"{soak['slope_bytes_per_step'] / MIB:+.3f} MiB per step (grew: a step more than {soak['grew_share']:.0%} "
        f"above step {_e(soak['first_timed_step'])}).</p>{warn}"
    )
    rows = "".join(f"<tr><td>{_e(step)}</td><td>{_mib1(peak)}</td></tr>" for step, peak in soak.get("step_peaks") or [])
    return note + f"<table id=soak><thead><tr><th>step</th><th>peak MiB</th></tr></thead><tbody>{rows}</tbody></table>"


def same_recipe_note(trials: list[Trial], flagged: dict | None = None) -> str:
    """Said under the reward curves when every trial that logged a reward trained one recipe
    (metrics.json `recipe`): the knobs change speed and memory only, so the curves agree, and when
    they agree exactly the lines lie on one another. flagged: the trials that changed the learning
    (learning.check_trials), named as the exception the check found."""
    logged = [t for t in trials if any("reward" in r for r in t.record.get("history") or [])]
    recipes = {repr(sorted((t.record.get("recipe") or {}).items())) for t in logged}
    if len(logged) < 2 or len(recipes) != 1 or not logged[0].record.get("recipe"):
        return ""
    curves = {tuple(r.get("reward") for r in t.record["history"]) for t in logged}
    how = (
        "so their curves are identical and the lines lie on top of one another"
        if len(curves) == 1
        else "so their curves differ only by sampling noise"
    )
    seed = " with the same seed" if len({t.config.get("seed") for t in logged}) == 1 else ""
    but = ""
    if flagged:
        names = ", ".join(t.name for t in logged if key_of(t) in flagged)
        but = f" Except where the learning check found otherwise: {names} changed the learning (see Equal learning)."
    return (
        f"<p id=same-recipe>All {len(logged)} trials that logged a reward trained the same recipe{seed}: the searched "
        f"settings change speed and memory, not what is learned, {how}.{_e(but)}</p>"
    )


def _value(v) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v).lower() if isinstance(v, bool) else str(v)


def _mib(n) -> str:
    return f"{n / MIB:.0f}" if isinstance(n, (int, float)) else "-"


def concessions_html(tags: dict, objective: str) -> str:
    """The Concessions section: the recipe the sweep held, whether it fits as it is, and for each recipe
    setting the winner gave up, what that bought (the sweeper's concessions.price_tags, stored on the study)."""
    if tags.get("error"):
        return f'<p class="note">Concessions not priced: {_e(tags["error"])}</p>'
    recipe = tags.get("recipe") or {}
    html = "<p>Recipe held: <code>" + _e(" ".join(f"{k}={_value(v)}" for k, v in recipe.items() if v is not None)) + "</code></p>"
    full = tags.get("full_recipe") or {}
    if full.get("fits"):
        html += (
            f"<p id=full-recipe>The full recipe fits: fastest trial {_e(full['trial'])}, {_e(objective)} "
            f"{full['objective']:.4g}, peak {_mib(full.get('peak_memory_bytes'))} MiB.</p>"
        )
    else:
        html += f"<p id=full-recipe>The full recipe does not fit: {_e(full.get('reason'))}</p>"
        cheap = tags.get("cheapest")
        if cheap:
            what = ", ".join(f"{k} {_value(v['recipe'])} &rarr; {_value(v['used'])}" for k, v in cheap["concessions"].items())
            html += (
                f"<p>Cheapest concession that fits: {what} "
                f"(trial {cheap['trial']}, {_e(objective)} {cheap['objective']:.4g}).</p>"
            )
    winner = tags.get("winner")
    rows = tags.get("taken") or []
    if winner and not rows:
        html += f"<p>The winner (trial {_e(winner['trial'])}) trains the full recipe: it gave nothing up.</p>"
    if rows:
        body = ""
        for r in rows:
            basis = r["basis"] + (f" (trial {winner['trial']} vs {r['vs_trial']})" if r.get("vs_trial") is not None else "")
            peak = f"{_mib(r.get('peak_at_recipe_bytes'))} &rarr; {_mib(r.get('peak_used_bytes'))}"
            cells = [_e(r["setting"]), _e(_value(r["recipe"])), _e(_value(r["used"])), _e(r["bought"]), peak, _e(basis)]
            body += "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        html += (
            f"<p>What the winner (trial {_e(winner['trial'])}) gave up, and what each concession bought:</p>"
            "<table id=concessions><thead><tr><th>setting</th><th>recipe</th><th>used</th><th>bought</th>"
            f"<th>peak MiB (recipe &rarr; used)</th><th>basis</th></tr></thead><tbody>{body}</tbody></table>"
        )
    return html


def learning_html(trials: list[Trial], verdict: best_rule.Verdict, flagged: dict[object, Departure]) -> str:
    """The Equal learning section: which trials changed the learning (their first steps' numbers against
    the others of their recipe and seed, report/learning.py), or that none did; and what it did to the winner.

    Args:
        trials: The trials.
        verdict: The best rule's verdict.
        flagged: The trials that changed the learning (study.best.decide's `flagged`).

    Returns:
        The section's HTML: only the unchecked note (maybe "") when fewer than two ok trials were compared.
    """
    unchecked: frozenset = getattr(flagged, "unchecked", frozenset())
    compared = [t for t in trials if t.status == Status.OK and t.record.get("history") and key_of(t) not in unchecked]
    tolerance = trials[0].learning_tolerance if trials else None
    at = f"tolerance {tolerance:g} relative" if tolerance is not None else "tolerance per precision: float32 1e-4, bf16 2e-2"
    alone = (
        f"<p id=unchecked-learning>Unchecked: {_e(', '.join(_label(trials, k) for k in sorted(unchecked, key=_numbers_first)))} "
        "(no other config of its recipe and seed ran, so nothing was compared with it).</p>"
        if unchecked
        else ""
    )
    if not flagged:
        if len(compared) < 2:
            return alone
        return (
            f"<p id=same-learning>No trial changed the learning: the {len(compared)} ok trials took the same first "
            f"steps as the others of their recipe and seed ({_e(at)}).</p>" + alone
        )
    rows = "".join(f"<tr><td class=l>{_e(_label(trials, k))}</td><td class=l>{_e(d.text)}</td></tr>" for k, d in flagged.items())
    return (
        f"<p>{len(flagged)} of {len(compared)} ok trials changed the learning: their first steps' numbers depart from "
        f"the others of their recipe and seed ({_e(at)}). A knob must not change what is learned: such a trial "
        "trained something else, and wins only when no other config can.</p>"
        f"<table id=changed-learning-trials><thead><tr><th class=l>trial</th><th class=l>what differed</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>" + alone
    )


def _numbers_first(key: object) -> tuple:
    return (not isinstance(key, int), key if isinstance(key, int) else 0, str(key))


def _label(trials: list[Trial], key: object) -> str:
    return next((t.name for t in trials if key_of(t) == key), str(key))


def model_rank_html(result: dict) -> str:
    """The Model vs measured rank section: Spearman's rho of the throughput model's predicted order
    against the measured one (trials.model_vs_measured), and each config's ranks: predicted, calibrated on
    the other configs' trials (where the trials measured their phases) and measured."""
    html = f"<p id=model-rank>{_e(model_trust_line(result))}</p>"
    if not result["rows"]:
        return html
    calibrated = result.get("rho_calibrated") is not None
    body = "".join(
        f"<tr><td>{_e(r['trial'])}</td><td>{r['predicted_rank']:g}</td>"
        + (f"<td>{r['calibrated_rank']:g}</td>" if calibrated else "")
        + f"<td>{r['measured_rank']:g}</td><td>{_fmt(r['predicted_tokens_per_s'])}</td>"
        + (f"<td>{_fmt(r['calibrated_tokens_per_s'])}</td>" if calibrated else "")
        + f"<td>{_fmt(r['measured'], 2)}</td></tr>"
        for r in result["rows"]
    )
    head = (
        "<th>trial</th><th>predicted rank</th>"
        + ("<th>calibrated rank</th>" if calibrated else "")
        + "<th>measured rank</th><th>model tok/s</th>"
        + ("<th>calibrated tok/s</th>" if calibrated else "")
        + "<th>measured</th>"
    )
    return (
        html + f"<table id=model-ranks><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        '<p class="note">The model ranks configs from datasheet speeds; its tokens/s is not a promise. '
        "A low rho on your card says: trust the measured trials, and start the next sweep from them.</p>"
    )


def _best_html(
    trials: list[Trial],
    ruling: best_rule.Verdict,
    flagged: dict[object, Departure],
    *,
    soak: dict | None,
    confirmation: dict | None,
) -> str:
    """The Best config section: the winner, its command line, what its learning changed, its soak's
    warning, the finalists and confirmation; a note when no trial fits.

    Args:
        trials: every trial of the sweep.
        ruling: learning_check's verdict (the median-of-runs ranking, its noise and tie).
        flagged: learning_check's trials that changed the learning.
        soak: the winner's soak (None: none ran).
        confirmation: the confirmation's state (None: none ran).

    Returns:
        The section's HTML, without its heading.
    """
    ranked = ruling.ranked
    if not ranked:
        return '<p class="note">No trial finished within memory: no best config.</p>'
    best, objective = ranked[0].item, trials[0].objective_name
    best_html = (
        f"<p>Best feasible trial: <b>{_e(best.name)}</b>, {_e(objective)} "
        f"{ranked[0].median:.1f}, peak {_fmt(best.gib('peak_memory_bytes'), 3)} GiB, "
        f"{_e(reward_text(best.record))}{_e(reward_time_text(best.record))}.</p>"
        f"<pre id=best-overrides>{_e(overrides(best))}</pre>"
    )
    said = verdict_lines(ruling, flagged, key_of, lambda k: _label(trials, k), rest=False)
    if said:
        best_html += "<p id=changed-learning>" + "<br>".join(_e(line[0].upper() + line[1:]) for line in said) + "</p>"
    if soak and soak.get("trial") == best.number:  # the winner's soak: a warning flags it here too
        best_html += soak_warning_html(soak)
    best_html += finalists_html(
        ruling,
        objective,
        confirmed=any(t.record.get("finalist") for t in trials),
        given_back=best_rule.gave_back(confirmation),
    )
    best_html += confirmation_html(confirmation or {})
    return best_html


def write_report(
    trials: list[Trial],
    out: Path,
    *,
    title: str,
    importances: dict | None = None,
    importance_note: str | None = None,
    concessions: dict | None = None,
    soak: dict | None = None,
    confirmation: dict | None = None,
) -> Path:
    """report.html in `out`, its figures beside it: the best config, then one section per view of the trials.

    Args:
        trials: The trials.
        out: The folder to write in.
        title: The page's title.
        importances: Optuna's parameter importances, or None.
        importance_note: Why there are no importances, when there are none.
        concessions: The price tags (the sweeper's concessions.price_tags, stored on the study), or None.
        soak: The soak's record, or None.
        confirmation: The confirmation phase's stored state, or None.

    Returns:
        The page's path.
    """
    out = Path(out)
    ruling, flagged = learning_check(trials)  # the median-of-runs rule, its noise, tie and the learning check
    best = ruling.ranked[0].item if ruling.ranked else None  # best_trial(trials)
    budget = budget_gib(trials)
    objective = trials[0].objective_name
    scatter = figs.throughput_vs_memory(trials, out / "throughput_vs_memory.png", budget=budget, best=best)
    effects_png = figs.lever_effects(trials, out / "lever_effects.png")
    rewards = figs.reward_curves(trials, out / "reward_curves.png")
    predicted = figs.predicted_vs_measured(trials, out / "predicted_vs_measured.png")
    imp_png = figs.importances(importances or {}, out / "param_importances.png")

    counts = {}
    for t in trials:
        counts[t.category] = counts.get(t.category, 0) + 1
    summary = ", ".join(f"{n} {c}" for c, n in counts.items())
    best_html = _best_html(trials, ruling, flagged, soak=soak, confirmation=confirmation)
    sections = [
        f"<h1>{_e(title)}</h1><p>{len(trials)} trials: {_e(summary)}."
        + (f" Budget {budget:.2f} GiB." if budget is not None else " No memory budget (gpu.memory_gib unset).")
        + "</p>",
        "<h2>Best config</h2>" + best_html,
        *(["<h2>Concessions</h2>" + concessions_html(concessions, objective)] if concessions else []),
        *([f"<h2>Equal learning</h2>{learned}"] if (learned := learning_html(trials, ruling, flagged)) else []),
        *(["<h2>Soak</h2>" + soak_html(soak)] if soak else []),
        "<h2>Throughput vs peak memory</h2>"
        + _figure(scatter, "throughput vs peak memory", "No trial measured its peak memory.")
        + '<p class="note">OOM trials sit at budget + deficit (what they needed) when both are known, '
        "else at the peak reached before the failure; pruned trials at their predicted peak.</p>",
        "<h2>Each lever's measured effect</h2>"
        + effects_table(lever_effects(trials), objective)
        + _figure(effects_png, "lever effects", "No lever varied across trials."),
        "<h2>Reward curves</h2>"
        + _figure(rewards, "reward curves", "No trial logged a reward.")
        + same_recipe_note(trials, flagged),
        "<h2>Predicted vs measured peak</h2>"
        + _figure(predicted, "predicted vs measured peak", "No trial has a memory prediction (predicted_peak_bytes)."),
        "<h2>Model vs measured rank</h2>" + model_rank_html(model_vs_measured(trials)),
    ]
    if importances is not None and (importances or importance_note):
        sections.append(
            "<h2>Parameter importances (Optuna)</h2>"
            + _figure(imp_png, "parameter importances", f"Not available: {importance_note}")
        )
    sections.append("<h2>Trials</h2><p class=note>Click a column header to sort.</p>" + trials_table(trials, best, flagged))
    page = (
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{CSS}</style>"
        f"</head><body>{''.join(sections)}<script>{JS}</script></body></html>"
    )
    path = out / REPORT_FILE
    path.write_text(page)
    return path
