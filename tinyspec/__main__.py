"""`python -m tinyspec`: what the commands are, on one screen."""

OVERVIEW = """tinyspec: a readable engine for speculative decoding (walkthrough.md is the book).

  python -m tinyspec.generate   generate text, plainly or speculatively, and see what happened
      --prompt "def fibonacci(n):" --method ar|draft|medusa [--show] [--temperature T] [--json]
  python -m tinyspec.bench      every method on the same held-out prompts: tau, tokens/s, speedup
      --quick                   (under a minute on a CPU); `bench kernels` times the Triton kernel (GPU)
  python -m tinyspec.train      train the tokenizer, a GPT (target or draft), or Medusa heads
      tokenizer | gpt --preset small | medusa   (outputs go to runs/, never over weights/)
  python -m tinyspec.course     hand out chapters as assignments and grade them with the tests
      list | handout DIR --chapters sampling,kvcache | grade DIR
  python -m tinyspec.data       regenerate the benchmark prompts from held-out stdlib modules

Each command has --help with examples. Tests: python -m pytest (the statistical ones: -m slow).
"""


def main() -> None:
    print(OVERVIEW, end="")


if __name__ == "__main__":
    main()
