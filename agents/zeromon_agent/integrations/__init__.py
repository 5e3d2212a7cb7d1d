"""zeromon in the trainers' own loggers: callbacks for Hugging Face's Trainer and Lightning's Trainer.

    from zeromon_agent.integrations.hf import ZeromonCallback          # transformers.TrainerCallback
    from zeromon_agent.integrations.lightning import ZeromonCallback   # lightning.pytorch.Callback

Each module imports its framework only when the callback class is first asked for, so importing this
package (or the agent) loads neither. docs/trainers.md lists the keys they log.
"""
