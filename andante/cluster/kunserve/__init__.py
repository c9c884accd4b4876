"""KunServe (paper: ../shared/seeds/002_c3fc17c3c14c1187.txt): under KV-cache pressure,
drop replicated layers and serve in pipeline-parallel groups; restore afterwards."""
