from tests.api.conftest import mix_store, tokens  # noqa: F401  (fixtures shared with the API tests)
