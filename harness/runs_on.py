"""What a check runs on: how it reached the implementation under test.

A suite marks each check with the concern it exercises (``@pytest.mark.concern("model")``); the
target says what that concern runs on there (:meth:`harness.targets.base.Target.runs_on`); the
results record it per check (``runs_on``) and the report counts it. One vocabulary for all
three, torch-free (the report and the gate read it without loading a model's libraries).
"""

REQUEST_PATH = "request path"
REAL_MODEL = "real model"
LORA_MANAGER = "LoRA manager"
REAL_PROCESSING_INFO = "real processing info"
FUNCTIONS = "classes and functions"
ENGINE = "engine"
SERVER = "server"

#: Each category with what it means, in the report's order.
RUNS_ON = {
    SERVER: "a user's request over HTTP through vLLM's OpenAI-compatible server (vllm serve, the "
    "official openai client): the API's content parts, the chat template, the server's tokenizer "
    "and processor under concurrent requests, its whole engine behind it",
    ENGINE: "a user's request through the target's whole engine (vLLM's LLM, its engine core in a "
    "process of its own): processor, scheduler, caches, model runner and language model",
    REQUEST_PATH: "a user's request through the target's engine: its processor, batching and "
    "a real model",
    REAL_MODEL: "built by the target's own constructor, loaded by its loader from the "
    "checkpoint folder or, for minimal-layer builds, with dummy weights",
    LORA_MANAGER: "adapter folders loaded and applied by the target's own LoRA machinery on "
    "such a model",
    REAL_PROCESSING_INFO: "the target's processor for the folder, its processor factory refusing",
    FUNCTIONS: "no instance: the implementation's classes and functions, class attributes included",
}
