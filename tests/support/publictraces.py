"""Small public production traces, written as their publishers spell them (header
and timestamps included), for the tests that read and replay them."""

from __future__ import annotations

__all__ = ["AZURE_2023", "AZURE_2024", "BURSTGPT"]

#: As AzureLLMInferenceTrace_code.csv (2023) spells it: seven fractional digits, no
#: zone (its first three lines).
AZURE_2023 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:17:03.9799600,4808,10\n"
    "2023-11-16 18:17:04.0319600,3180,8\n"
    "2023-11-16 18:17:04.0781490,110,27\n"
)
#: As the 2024 week-long files spell it: six digits, or none on a whole second,
#: and the offset; here out of order, and across midnight.
AZURE_2024 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2024-05-12 00:00:00.001163+00:00,1452,3\n"
    "2024-05-12 00:00:00+00:00,584,3\n"
    "2024-05-11 23:59:59.999999+00:00,862,38\n"
    "2024-05-12 01:00:00.500000+01:00,7,1\n"
)
#: BurstGPT_1.csv's header; line 3 failed (Response tokens 0).
BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,GPT-4,1087,0,1087,API log\n"
    "46.5,ChatGPT,10,3,13,Conversation log\n"
)
