"""`Spelling` answers what decoding the whole prefix would, in time linear in the text."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cpu_bound import cpu_bound
from tests.verifierd.evidence.vocabulary import Vocabulary
from verifierd.evidence.spelling import Spelled, Spelling


def _reference(vocab: Vocabulary, target: str, ids: Sequence[int]) -> Spelled:
    text, pending = vocab.text.text_after(ids)
    common = min(len(text), len(target))
    return Spelled(len(text), pending, text[:common] == target[:common])


def _spelling(vocab: Vocabulary, target: str) -> Spelling:
    return Spelling(target, vocab.text.bytes_of, vocab.text.text_after)


def _ids(vocab: Vocabulary) -> st.SearchStrategy[list[int]]:
    kinds = st.sampled_from(["word", "high", "invisible"])

    @st.composite
    def one(draw: st.DrawFn) -> int:
        pool = {"word": vocab.words, "high": vocab.high_bytes, "invisible": vocab.invisible}
        return draw(st.sampled_from(pool[draw(kinds)]))

    return st.lists(one(), max_size=40)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), spell_target=st.booleans())
def test_each_answer_is_what_decoding_the_whole_prefix_gives(
    vocab: Vocabulary, data: st.DataObject, spell_target: bool
) -> None:
    settled = data.draw(_ids(vocab), label="settled")
    tail = data.draw(_ids(vocab).map(lambda ids: ids[:3]), label="tail")
    # The target is usually what the tokens spell (the search's case), sometimes not.
    target = vocab.text.text_after([*settled, *tail, *data.draw(_ids(vocab))])[0]
    if not spell_target:
        target = data.draw(st.text(alphabet="ab\ufffd€ ", max_size=30))
    spelling = _spelling(vocab, target)
    for k, token in enumerate(settled):
        assert spelling.after([]) == _reference(vocab, target, settled[:k])
        spelling.settle(token)
    assert spelling.after(tail) == _reference(vocab, target, [*settled, *tail])


def test_questions_along_a_long_text_cost_linear_time(vocab: Vocabulary) -> None:
    ids = [vocab.words[i % 50] for i in range(40_000)]
    target, _ = vocab.text.text_after(ids)
    spelling = _spelling(vocab, target)
    with cpu_bound(5.0):
        for token in ids:
            spelling.after([vocab.words[7]])
            spelling.settle(token)
