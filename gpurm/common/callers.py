"""The names a caller travels under, which clients send and the RM reads: the gRPC metadata keys of a claimed user
(insecure mode only) and of an AM token, and the certificate name prefix of AM processes. The rules the RM applies
to them are in gpurm/rm/security/identity.py."""

USER_KEY = "x-gpurm-user"
AM_TOKEN_KEY = "x-gpurm-am-token"
AM_PREFIX = "am:"      # CN of the certificate AM processes dial with (agent.yaml `am_tls`)
