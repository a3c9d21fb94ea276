"""The RAG example's parts: the generated corpus, the FTS5 retriever, the reply parser, the command line."""

from __future__ import annotations

import pytest

from examples.rag import corpus
from examples.rag.agent import Retriever, parse_action
from examples.rag.train import COMMAND, cpu_tasks, vocabulary


def test_questions_follow_their_chains_and_validation_is_held_out() -> None:
    world = corpus.build_world(seed=0)
    train, val = corpus.split(seed=0)
    assert len(train) + len(val) == len(corpus.TEMPLATES) * len(corpus.FILMS)
    assert {q["topic"] for q in train}.isdisjoint({q["topic"] for q in val})
    for q in train + val:
        assert world.follow(q["topic"], tuple(q["chain"]))[-1] == q["answer"]
        assert q["hops"] in (2, 3)
    assert corpus.build_world(seed=0) == world  # the same seed gives the same world everywhere


def test_answer_metrics() -> None:
    assert corpus.answer_f1("Oslo", "oslo") == corpus.exact_match("the Oslo.", "Oslo") == 1.0
    assert corpus.answer_f1("Oslo Lyon", "Oslo") == pytest.approx(2 / 3)
    assert corpus.answer_f1("", "Oslo") == corpus.exact_match("Lyon", "Oslo") == 0.0


def test_retriever_searches_the_passages_of_one_entity() -> None:
    world = corpus.build_world(seed=0)
    retriever = Retriever(world.passages)
    assert retriever.link("where was the director of Alpha born") == "Alpha"
    hit = retriever.search("Alpha", "director")
    assert hit is not None and hit.answer == world.facts[("Alpha", "director")]
    assert retriever.search("Alpha", "birthplace") is None  # films have no birthplace
    assert retriever.search("Alpha", "??") is None


def test_parse_action_reads_short_and_long_replies() -> None:
    assert parse_action("search director") == parse_action(" director") or parse_action(" director").kind == "search"
    assert parse_action("search director").text == "director"
    assert parse_action("answer").text == ""
    assert parse_action("Answer: Oslo") == parse_action("answer Oslo")
    assert parse_action("director answer").kind == "search"  # the first action named wins


def test_cpu_tasks_fit_the_tiny_policy() -> None:
    from agentlightning_trainer.torch_backend.tokenizer import WordCharTokenizer
    from examples.rag.agent import INSTRUCTIONS, prompt

    train, val = cpu_tasks()
    assert train and val and all(t["max_turns"] == 2 for t in train + val)
    tokenizer = WordCharTokenizer(vocabulary())
    facts = ["The director of Alpha is Marlow ."]
    longest = max(
        len(tokenizer.encode_chat([{"role": "system", "content": INSTRUCTIONS},
                                   {"role": "user", "content": prompt(t["question"], "Marlow", facts)}]))
        for t in train
    )  # fmt: skip
    assert longest < 120


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--backend", "verl"], "pass --model PATH"),
        (["--dev", "--model", "org/model"], "takes no --model"),
        (["--model", "not a model"], "neither a local path"),
        (["--steps", "0"], "at least 1"),
    ],
)
def test_gpu_options_are_validated(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        COMMAND.parse_args(argv)
    assert message in capsys.readouterr().err


def test_gpu_options_accepted() -> None:
    args = COMMAND.parse_args(["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--backend", "torch"])
    assert args.model == "Qwen/Qwen2.5-1.5B-Instruct" and args.backend == "torch"
