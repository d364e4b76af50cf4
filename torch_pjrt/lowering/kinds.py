"""How the machinery treats each argument of an ATen schema, by type."""

TENSOR, OPT_TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, SCALAR, SCALAR_LIST, GENERATOR, OTHER = range(8)

BY_TYPE = {
    "Tensor": TENSOR,
    "Tensor?": OPT_TENSOR, "Optional[Tensor]": OPT_TENSOR,
    "Tensor[]": TENSOR_LIST, "List[Tensor]": TENSOR_LIST,
    "Tensor?[]": OPT_TENSOR_LIST, "List[Optional[Tensor]]": OPT_TENSOR_LIST,
    "Scalar": SCALAR, "number": SCALAR,
    "Scalar[]": SCALAR_LIST, "List[number]": SCALAR_LIST,
    "Generator?": GENERATOR, "Optional[Generator]": GENERATOR, "Generator": GENERATOR,
}


def of(schema_type) -> int:
    return BY_TYPE.get(str(schema_type), OTHER)
