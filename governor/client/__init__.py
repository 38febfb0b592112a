"""The client core: a JSON-RPC connection to ftgovd and the ``job`` that training code holds for its life.

Everything else that talks to the daemon (the Hugging Face and Lightning callbacks, ``ftgov run``, ``ftgov status``)
is a thin layer over this module. It needs nothing beyond the standard library and pydantic (through
governor.features), so importing it costs nothing on a training machine.

The job's hold on the GPU frequency lives as long as its connection: the daemon ends a job at ``unregister``, when the
connection closes, or when the process exits. A job therefore keeps its connection open and closes it on every way out.
"""

from __future__ import annotations

from governor import SOCKET_GROUP
from governor.client.adapter import AdapterCore
from governor.client.connection import (
                                        DEFAULT_REPORT_EVERY_S,
                                        DEFAULT_SOCKET,
                                        MAX_REPLY_BYTES,
                                        SOCKET_ENV,
                                        Connection,
                                        DaemonUnavailable,
                                        GovernorWarning,
                                        InvalidParams,
                                        InvalidRequest,
                                        LimitExceeded,
                                        MethodNotFound,
                                        NotPermitted,
                                        ParseError,
                                        RpcError,
                                        ServerError,
                                        SocketPermissionError,
                                        UnknownJob,
                                        rpc_error,
                                        socket_path,
)
from governor.client.features import (
                                        batch_tokens,
                                        check_features,
                                        check_partial_features,
                                        find_hf_config,
                                        resolve_features,
                                        visible_gpu,
)
from governor.client.job import RUN_JOB_ENV, Job, describe_reply, job, start_job

__all__ = ["AdapterCore", "Connection", "DEFAULT_REPORT_EVERY_S", "DEFAULT_SOCKET", "DaemonUnavailable",
           "GovernorWarning", "InvalidParams", "InvalidRequest", "Job", "LimitExceeded", "MAX_REPLY_BYTES",
           "MethodNotFound", "NotPermitted", "ParseError", "RUN_JOB_ENV", "RpcError", "SOCKET_ENV", "SOCKET_GROUP",
           "ServerError", "SocketPermissionError", "UnknownJob", "batch_tokens", "check_features",
           "check_partial_features", "describe_reply", "find_hf_config", "job", "resolve_features", "rpc_error",
           "socket_path", "start_job", "visible_gpu"]
