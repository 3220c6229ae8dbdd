"""The bundled pack: size, splits, exclusion list, determinism, and the empty-success guard."""
import collections
import filecmp
from pathlib import Path

from tbhpc.domains import DOMAIN_NAMES, catalogs, get_domain
from tbhpc.domains.pack import DEFAULT_SEED, write_pack
from tbhpc.env.golden import golden_state, initial_state
from tbhpc.env.state import state_hash
from tbhpc.tasks.loader import default_pack_dir, load_exclusions, validate_tasks


def test_pack_size_and_shape(pack_tasks):
    per_domain = collections.Counter(t.domain for t in pack_tasks)
    assert set(per_domain) == set(DOMAIN_NAMES)
    assert all(n >= 120 for n in per_domain.values()), per_domain
    assert len(pack_tasks) >= 600
    assert all(1 <= t.n_golden_calls <= 10 for t in pack_tasks)
    difficulties = collections.Counter(next(x for x in t.tags if x.startswith("difficulty:")) for t in pack_tasks)
    assert len(difficulties) == 3 and min(difficulties.values()) >= 10, difficulties
    validate_tasks(pack_tasks, catalogs())


def test_domains_have_ten_tools_including_ticketing_and_search():
    for name in DOMAIN_NAMES:
        tools = get_domain(name).tools
        assert len(tools) >= 10, name
        assert {"create_ticket", "update_ticket", "get_ticket", "search_policy"} <= set(tools), name


def test_splits_disjoint_by_id_and_instance_and_exclusion_list(pack_tasks):
    train = [t for t in pack_tasks if t.split == "train"]
    evals = [t for t in pack_tasks if t.split == "eval"]
    assert train and evals
    assert not {t.id for t in train} & {t.id for t in evals}
    assert not {t.instance for t in train} & {t.instance for t in evals}
    assert load_exclusions(default_pack_dir() / "eval_ids.txt") == {t.id for t in evals}


def test_regenerating_with_the_same_seed_gives_identical_files(tmp_path: Path):
    write_pack(tmp_path, DEFAULT_SEED)
    bundled = default_pack_dir()
    names = sorted(p.name for p in bundled.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(bundled, tmp_path, names, shallow=False)
    assert not mismatch and not errors, mismatch


def test_read_only_tasks_cannot_pass_by_doing_nothing(pack_tasks):
    read_only = 0
    for t in pack_tasks:
        domain = get_domain(t.domain)
        if state_hash(initial_state(domain, t)) == golden_state(domain, t)[1]:
            read_only += 1
            assert t.output_contains or t.rubrics_yesno, t.id
    assert read_only >= 50  # the pack does test information and refusal tasks


def test_policy_decisions_change_the_golden_outcome(pack_tasks):
    """Some templates yield different golden actions for different data (window, tier, plan)."""
    by_template = collections.defaultdict(set)
    for t in pack_tasks:
        by_template[(t.domain, t.template)].add(tuple(c.tool for c in t.golden_calls))
    branching = [k for k, v in by_template.items() if len(v) > 1]
    assert len(branching) >= 10, branching
