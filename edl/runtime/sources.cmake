# edl/runtime: elastic runtime sources (included by edl/CMakeLists.txt).
list(APPEND EDL_SOURCES
  runtime/data_plan.cc
  runtime/lr_schedule.cc
  runtime/self_measure.cc
)
list(APPEND EDL_SOURCES
  runtime/membership.cc
  runtime/elastic_trainer.cc
  runtime/elastic_trainer_switch.cc
  runtime/elastic_trainer_util.cc
)
list(APPEND EDL_SOURCES
  runtime/channel_membership.cc
  runtime/checkpoint_loader.cc
  runtime/cuda_plugin.cc
)
list(APPEND EDL_SOURCES
  runtime/env_contract.cc
  runtime/run_mode.cc
  runtime/training_state.cc
  runtime/teacher_client.cc
)
