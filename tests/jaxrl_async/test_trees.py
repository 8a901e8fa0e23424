"""`check_like` and `cast_floats`: the one tree check and the one float cast."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_async.trees import TreeMismatch, cast_floats, check_like, leaves_by_path, path_str


def reference():
    return {"params": {"embed": jnp.zeros((4, 2)), "layers": {"wq": jnp.zeros((2, 2, 3)), "scale": jnp.ones(2)}},
            "opt_state": ({"mu": {"embed": jnp.zeros((4, 2))}}, {"count": jnp.zeros((), jnp.int32)})}


def test_a_tree_with_the_same_paths_shapes_and_dtypes_fits():
    ref = reference()
    check_like(ref, jax.tree.map(np.asarray, ref), "the copy")
    check_like(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), ref), ref, "the original")


def test_paths_are_slash_separated_keys_indices_and_attribute_names():
    paths = list(leaves_by_path(reference()))
    assert paths == ["opt_state/0/mu/embed", "opt_state/1/count", "params/embed", "params/layers/scale",
                     "params/layers/wq"]
    assert path_str((jax.tree_util.GetAttrKey("mu"), jax.tree_util.SequenceKey(2))) == "mu/2"


def test_a_missing_path_is_named_with_its_reference_shape_and_the_count():
    incoming = reference()
    del incoming["params"]["layers"]
    with pytest.raises(TreeMismatch, match=r"^params/layers/scale \(float32\[2\]\) is missing from the push "
                                           r"\(2 missing in all\)$"):
        check_like(reference(), incoming, "the push")


def test_an_unexpected_path_is_named_with_its_incoming_shape():
    incoming = reference()
    incoming["params"]["bias"] = np.zeros(3, np.float16)
    with pytest.raises(TreeMismatch, match=r"^params/bias \(float16\[3\]\) in the push is unexpected$"):
        check_like(reference(), incoming, "the push")


def test_a_wrong_shape_names_the_leaf_with_incoming_and_reference_shape():
    incoming = reference()
    incoming["params"]["layers"]["wq"] = jnp.zeros((2, 3, 2))
    with pytest.raises(TreeMismatch, match=r"^params/layers/wq is float32\[2, 3, 2\] in the push; "
                                           r"expected float32\[2, 2, 3\]$"):
        check_like(reference(), incoming, "the push")


def test_a_wrong_dtype_names_the_leaf_with_both_dtypes():
    incoming = reference()
    incoming["opt_state"][1]["count"] = jnp.zeros((), jnp.float32)
    with pytest.raises(TreeMismatch, match=r"^opt_state/1/count is float32\[\] in the push; expected int32\[\]$"):
        check_like(reference(), incoming, "the push")


def test_a_scalar_python_leaf_is_described_by_numpy():
    with pytest.raises(TreeMismatch, match=r"^x is float64\[\] in the push; expected float32\[\]$"):
        check_like({"x": jnp.zeros(())}, {"x": 1.0}, "the push")


def test_the_model_s_own_arrays_are_reported_before_the_optimizer_s_copies():
    incoming = reference()
    incoming["params"]["embed"] = jnp.zeros((5, 2))
    incoming["opt_state"][0]["mu"]["embed"] = jnp.zeros((5, 2))  # sorts first, but is deeper
    with pytest.raises(TreeMismatch, match=r"^params/embed is"):
        check_like(reference(), incoming, "the push")


def test_a_missing_path_is_reported_before_a_differing_shape():
    incoming = reference()
    incoming["params"]["embed"] = jnp.zeros((5, 2))
    del incoming["params"]["layers"]["wq"]
    with pytest.raises(TreeMismatch, match=r"^params/layers/wq .* is missing"):
        check_like(reference(), incoming, "the push")


def test_an_nnx_state_is_compared_as_its_pure_dict():
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    check_like({"params": state}, {"params": nnx.to_pure_dict(state)}, "the push")
    with pytest.raises(TreeMismatch, match=r"^params/kernel is float32\[3, 2\]"):
        check_like({"params": state}, {"params": {"bias": jnp.zeros(3), "kernel": jnp.zeros((3, 2))}}, "the push")


def test_a_tree_mismatch_is_a_value_error():
    assert issubclass(TreeMismatch, ValueError)


def test_cast_floats_casts_float_leaves_only():
    tree = {"w": jnp.ones((2,), jnp.float32), "ids": jnp.arange(3), "host": np.ones(2, np.float32)}
    out = cast_floats(tree, "bfloat16")
    assert (out["w"].dtype, out["ids"].dtype, out["host"].dtype) == (jnp.bfloat16, tree["ids"].dtype, jnp.bfloat16)
    assert isinstance(out["host"], np.ndarray)
