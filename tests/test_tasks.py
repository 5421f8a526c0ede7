"""The task suite: deterministic generators, disjoint splits, exact scoring."""

import pytest

from unmask.tasks import TASKS, Example, score, held_out, train_stream, vocabulary
from unmask.train.data import TaskSampler, build_tokenizer


@pytest.mark.parametrize("task", TASKS)
def test_generators_are_deterministic(task):
    assert held_out(task, 50) == held_out(task, 50)
    a = [next(s) for s in [train_stream(task, 3, exclude_n=50)] for _ in range(20)]
    b = [next(s) for s in [train_stream(task, 3, exclude_n=50)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize("task", TASKS)
def test_train_and_test_prompts_never_overlap(task):
    held = {ex.prompt for ex in held_out(task, 300)}
    assert len(held) == 300
    stream = train_stream(task, 0, exclude_n=300)
    assert not any(next(stream).prompt in held for _ in range(3000))


def test_sampler_skips_held_out_and_resumes():
    s = TaskSampler({t: 1.0 for t in TASKS}, seed=5, exclude_n=200)
    held = {ex.prompt for t in TASKS for ex in held_out(t, 200)}
    first = [s.next() for _ in range(500)]
    assert not any(ex.prompt in held for ex in first)
    state = s.state()
    nxt = [s.next() for _ in range(10)]
    s.set_state(state)
    assert [s.next() for _ in range(10)] == nxt


def test_every_word_is_in_the_vocabulary():
    tok = build_tokenizer()
    unk = tok.token_to_id("<|pad|>")
    assert len(set(vocabulary())) == len(vocabulary())
    for task in TASKS:
        for ex in held_out(task, 100):
            for text in (ex.prompt, ex.answer):
                assert unk not in tok.encode(text, add_special_tokens=False).ids, text


def test_arith_is_written_least_significant_digit_first():
    ops = set()
    for ex in held_out("arith", 50):
        words = ex.prompt.split()
        a, b = int("".join(words[3:0:-1])), int("".join(words[7:4:-1]))  # digits LSB first
        r = a + b if words[0] == "add" else a - b
        assert r >= 0 and ex.answer == " ".join(reversed(str(r).zfill(4)))
        ops.add(words[0])
    assert ops == {"add", "sub"}
    assert arith_task_for(123, 456) == ("add 3 2 1 + 6 5 4 =", "9 7 5 0")


def arith_task_for(a: int, b: int) -> tuple[str, str]:
    import random

    from unmask.tasks.suite import arith_task

    class Fixed(random.Random):  # randint yields a then b; random() < 0.5 picks addition
        def __init__(self):
            super().__init__(0)
            self.vals = [a, b]

        def randint(self, lo, hi):
            return self.vals.pop(0)

        def random(self):
            return 0.0

    ex = arith_task(Fixed())
    return ex.prompt, ex.answer


def test_copy_and_reverse_items_are_distinct():
    for task in ("copy", "reverse"):
        lengths = set()
        for ex in held_out(task, 200):
            items = ex.prompt.split()[2:]
            assert len(set(items)) == len(items), ex
            lengths.add(len(items))
        assert lengths == set(range(3, 9))


def test_sort_and_reverse_answers():
    for ex in held_out("sort", 30):
        assert ex.answer.split() == sorted(ex.prompt.split()[2:])
    for ex in held_out("reverse", 30):
        assert ex.answer.split() == ex.prompt.split()[2:][::-1]


def test_pairs_validity_rejects_mixtures():
    ex = Example("pairs", "pick hand a b c :", "full house", ("full house", "high card"))
    assert score(ex, "high card").exact and score(ex, "full house").exact
    assert not score(ex, "high house").exact and not score(ex, "full card").exact
    assert score(ex, "high house").token_accuracy == pytest.approx(2 / 3)


def test_token_accuracy_counts_up_to_end_of_text():
    ex = Example("copy", "copy : a b c", "a b c")
    assert score(ex, "a b c").token_accuracy == 1.0
    assert score(ex, "a b c d").token_accuracy == pytest.approx(3 / 4)  # missed the end of text
    assert score(ex, "a x").token_accuracy == pytest.approx(1 / 4)
    assert score(ex, "").token_accuracy == 0.0
