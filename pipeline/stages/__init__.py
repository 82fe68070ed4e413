"""Product stages, one module each: policy as plain functions over pydantic models, plus a thin Stage."""
