"""Evaluation settings for grids whose tests claim where, when or how often trials run, or what a search
chooses, rather than what the trials score: no corruption sets or bit depths, one small attack, no transfer
attack.  test_end_to_end and test_paper_grids run the full evaluation through Ray and in a trial."""

LIGHT_EVALUATION = {
    "corruptions": {"types": []},
    "bit_depths": [],
    "adversarial": {"attacks": ["fgsm"], "n_examples": 100, "transfer": False},
}
