// Cluster: the job server's whole decision state, for one job or many (docs/CLUSTER.md;
// docs/ARCHITECTURE.md, "The job server"). Like everything it owns it is pure: no sockets, no
// threads, time from an injected Clock; the server (server.h) authenticates peers, decodes their
// frames, calls the Cluster and carries out its actions.
//
// It owns:
//  - the NodeRegistry (node_registry.h), the one home of node identity and liveness. Nodes join
//    the cluster (slots, and the job types their own client configuration offers), not a job.
//  - one JobMembership per live job (job_membership.h): its generations, two-phase growth,
//    in-place shrink, joiners and leavers;
//  - the policy that decides how many trainers each job gets on each node:
//      * a one-job server (`edl server`, ClusterOptions::one_job): the job exists from the start
//        and is granted every slot of every node; its size follows its own flags, the scaling
//        script or the demo policy, and `edl ctl scale N`;
//      * a cluster server (`edl server --cluster`): jobs are submitted (JobSpec), scaled and
//        cancelled, and the ClusterPolicy (cluster_policy.h) shares the nodes among them.
//    The Cluster turns the policy's counts into concrete slots (a job keeps the slots its trainers
//    hold; it gives up first the slots where none of its trainers runs, then the slots of its
//    highest ranks) and hands each job its slots (JobMembership::SetAllocation).
//  - the trainers' latest progress reports, per job (for `edl ctl status` and the events log).
//
// A slot given up by one job may still hold that job's leaving trainer for a moment; the node's
// client starts the next job's trainer there once it has exited.
//
// Trainer ids are unique across jobs (one counter for every job), so a node's report about a
// trainer is routed by the id alone (JobOfTrainer, Authorized).
//
// Thread-safety: none; the server's io_context thread only.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "edl/proto/trainer_events.h"
#include "jobserver/events/events.h"
#include "jobserver/job_membership.h"
#include "jobserver/node_registry.h"
#include "jobserver/policy/cluster_policy.h"
#include "jobserver/policy/goodput_feed.h"
#include "jobserver/policy/job_spec.h"
#include "jobserver/state/cluster_state.h"

namespace edl::jobserver {

struct ClusterOptions {
  // A one-job server: this job (its name is the server's --job_id), created at construction,
  // granted every slot of every node. Unset: a cluster server, whose jobs are submitted.
  std::optional<MembershipOptions> one_job;
  int64_t heartbeat_timeout_us = 5'000'000;  // a node silent this long is lost
  ClusterPolicyOptions policy;
  // Submitted jobs' settings (join timeout, backoff, master ports); job_id and sizes are the
  // submission's.
  MembershipOptions job_defaults;
  // Submissions may set checkpoint_dir only under this absolute path; empty: they may not set it.
  std::string checkpoint_root;
  size_t max_finished_kept = 100;  // finished and cancelled jobs listed by `edl ctl jobs`
  // Most jobs pending at once (submitted, not started): a cluster server refuses more submissions
  // (each pending job holds an events log and state) until some start or are cancelled.
  size_t max_pending_jobs = 256;
};

// One action of one job (Action::kind as in job_membership.h), or a cluster-level one (job
// empty: an events-log record of the server's own log, or a kill of stale trainers).
struct JobAction {
  std::string job;
  Action action;
};

// Failures alike in a row (same exit, same last log line, no progress between) that make a job
// `failing` in `edl ctl status`.
constexpr int kFailingAfter = 3;

class Cluster {
 public:
  Cluster(ClusterOptions options, Clock* clock);

  // ---- nodes
  // Whether a client presenting `session` may register as node `name` now (NodeRegistry).
  Status CheckAdmission(const std::string& name, const std::string& session) const {
    return registry_.CheckAdmission(name, session);
  }
  // A node's client registered (after CheckAdmission; the server first drops the node's old
  // connection). *session: the node's token for the welcome; *known: a re-attach. `running` (ids)
  // are the trainers its client still runs and `generations` (empty: unknown) the generation each
  // is in: a live job's trainers are handed to their job (NodeAttached: survivors are adopted, a
  // member not running failed), a leaving trainer is left to leave, any other is killed
  // (`stale_trainers`).
  Status AddNode(const ClusterNode& node, const std::vector<std::string>& running,
                 const std::vector<int64_t>& generations, std::string* session, bool* known);
  void NodeDisconnected(const std::string& name);
  void Heartbeat(const std::string& name) { registry_.Heard(name); }
  void SetNodeStats(const std::string& name, const proto::NodeStats& s) {
    registry_.SetStats(name, s);
  }
  const NodeRegistry& registry() const { return registry_; }

  // ---- jobs
  // The one-job server's job; empty on a cluster server.
  const std::string& own_job() const { return own_job_; }
  // Checks the spec (CheckJobSpec against the live nodes' offers) and submits it to the policy.
  // FailedPrecondition on a one-job server.
  Status Submit(const JobSpec& spec);
  // Stops the job in one generation without its trainers (reason "stop", no failure); its slots
  // go to the other jobs; it is listed as cancelled. FailedPrecondition on a one-job server.
  Status Cancel(const std::string& name);
  // `edl ctl scale --job NAME N`: the job's size cap (one-job server: its desired size; NAME may be
  // empty there). NotFound for no such live job.
  Status Scale(const std::string& name, int n);
  // The one job's scaling sources (the server's --scale_script and demo policy); no-ops on a
  // cluster server.
  void SetDesired(int n, const std::string& reason);
  void AddDesired(int delta, const std::string& reason);
  void KillTrainers(int k);
  void KillAllTrainers();
  // `edl ctl stop` of the one job (JobMembership::Stop). False when there is none, or nothing runs.
  bool StopOwnJob(const std::string& by, std::vector<proto::MemberInfo>* leaving);
  // Generations of the one job issued from now on are above `g` (the checkpoint store's newest).
  void RaiseGenerationFloor(int64_t g);

  // ---- a node's reports, routed by trainer id
  // The live job that placed `trainer_id` on `node` ("" when none: a leaving trainer, or one of an
  // ended job, or not this node's).
  std::string JobOfTrainer(const std::string& trainer_id, const std::string& node) const;
  // Whether `node` may report about `trainer_id` (PROTOCOL.md "Client -> server"): a job placed it
  // there and it may still run (live, or leaving), or the cluster killed it there as stale. *job:
  // the job that placed it ("" for a stale one); its progress counts only while it is live.
  bool Authorized(const std::string& trainer_id, const std::string& node, std::string* job) const;
  // `error`: the failed trainer's last log line (may be empty). A job whose trainers fail the same
  // way (same exit, same line) kFailingAfter times in a row, with no step of progress between, is
  // `failing` (StatusJson, and a "failing" record once); progress clears it.
  void TrainerExited(const std::string& trainer_id, const std::string& node, bool success,
                     const std::string& how, const std::string& error = "");
  void TrainerReady(const std::string& trainer_id, const std::string& node, int64_t generation);
  // A live trainer's progress (kept until it leaves the job's generations).
  void Progress(const std::string& job, const std::string& trainer_id,
                const proto::ProgressReport& r);
  // A trainer event of `job`, typed (edl/proto/trainer_events.h): a joiner's first step, a
  // failed re-form or communicator (the membership answers them), and what `edl ctl status` shows:
  // checkpoint saves that failed or the fence refused, the final save of a stop, and each member's
  // configuration (a joiner whose configuration differs from the job's is refused). Other kinds
  // and malformed events have no effect.
  void TrainerEvent(const std::string& job, const std::string& trainer_id, const std::string& node,
                    const proto::TrainerEventBody& event);
  // The final checkpoint of `job`'s stop, as rank 0 reported it (*error: why it failed).
  using FinalCheckpoint = events::FinalCheckpoint;
  FinalCheckpoint FinalCheckpointOf(const std::string& job, std::string* error) const;

  void Tick();  // heartbeats, the policy's timers, each job's membership
  // Takes every action since the last call, in order.
  std::vector<JobAction> TakeActions();

  // ---- state
  // A live job's membership (a one-job server's job is live until the server stops), or null.
  const JobMembership* FindJob(const std::string& name) const;
  // A submitted job's spec; null for the one job (its flags are the server's) and unknown names.
  const JobSpec* FindSpec(const std::string& name) const;
  // Every live job's name, by submission order.
  std::vector<std::string> JobNames() const;
  // Jobs node `name` may run: every job on a one-job server, the jobs whose type it offers on a
  // cluster server (the node needs their type and flags to run them).
  std::vector<std::string> JobsFor(const std::string& node) const;
  // Whether live job `job` holds slots on `node` (its trainers there may use its rendezvous KV).
  bool Hosts(const std::string& node, const std::string& job) const;
  // The slots no job holds, per node, where teachers may run (cluster_policy.h, step 5); none on a
  // one-job server, whose teachers run in their clients' own teacher slots.
  std::optional<std::map<std::string, int>> TeacherCapacity() const;
  int submitted_jobs() const { return submitted_; }
  nlohmann::json JobsJson() const;  // for `edl ctl jobs`: {"jobs": live, "ended": ended}
  // The body of `edl ctl status` (docs/WATCHING.md "edl ctl"): the one job's summary with its
  // progress, or the cluster's jobs, nodes and utilisation.
  nlohmann::json StatusJson() const;
  // Progress of live job `job` from its members' reports: how many report, the highest step and
  // epoch, rank 0's loss and accuracy, the sum of images/s (an empty object for no such job).
  nlohmann::json ProgressSummary(const std::string& job) const;
  // The same as the events log's "progress" record, with the job's generation and world size
  // (reporting 0 for no such job).
  events::Progress ProgressOf(const std::string& job) const;
  // What live job `job` measures of itself (edl/runtime/self_measure.h), from its current
  // members' reports: the gradient noise estimate (rank 0's; every rank holds the same), and
  // the members' mean compute seconds per sample and all-reduce seconds per step at the current
  // world size and node count. An empty object while nothing is measured.
  nlohmann::json MeasuredJson(const std::string& job) const;

  // ---- durable state (jobserver/state/STATE.md)
  // Everything a restarted server needs to resume every job, the nodes with their tokens.
  void Snapshot(ClusterState* s) const;
  // Resumes a saved cluster on a fresh Cluster: its nodes known but disconnected (one heartbeat
  // timeout of grace on top of the usual one), each job at its placement with its membership
  // restored (survivors are adopted as their nodes re-attach, numbers go on above the saved ones).
  // Corruption when the jobs' slots do not fit the nodes; FailedPrecondition when the state is a
  // one-job server's and this a cluster server, or the other way round.
  Status Restore(const ClusterState& s);

 private:
  struct Job {
    JobSpec spec;  // the one job's: its name only
    std::unique_ptr<JobMembership> membership;
    std::map<std::string, std::vector<int>> slots;  // node -> the slots it holds there
    int port_index = 0;  // MASTER_PORT range: job_defaults.master_port_base + 1000 * port_index
    std::map<std::string, proto::ProgressReport> progress;  // live trainers' latest, by id
    int64_t last_step = -1;  // the highest step reported, and when it was first seen
    int64_t last_progress_us = -1;
    // Failures in a row that looked the same (how + error line), since the last progress.
    std::string failure_key, failure_how, failure_error;
    int failures_alike = 0;
    int64_t failing_since_us = -1;
    // Checkpoint saves that failed (refused by the fence, or an error), from rank 0's events.
    int64_t checkpoint_failures = 0, checkpoint_refusals = 0, checkpoint_failed_step = -1;
    std::string checkpoint_error;
    bool final_checkpoint_reported = false, final_checkpoint_ok = true;
    std::string final_checkpoint_error;
    std::string config;  // the configuration fingerprint its members share (the first reported)
    std::map<std::string, std::string> configs;  // joiners' reported configurations, by id
    // What its trainers measure, turned into its goodput model (a cluster server's jobs only).
    GoodputFeed goodput;
    std::string goodput_refused;  // why the policy refused its latest model ("" : it took it)
  };
  // A job's current world as its members' reports of that world measure it (MeasuredJson).
  struct Measured {
    const proto::ProgressReport* rank0 = nullptr;  // rank 0's latest report, any generation
    double compute_s_per_sample = -1;  // members' mean, reports of this generation; -1: none
    double sync_s = -1;                // the same; -1: none
    int world = 0, nodes = 0;
  };
  Measured MeasureOf(const Job& job) const;
  // A member's progress of a cluster server's job: feeds its goodput model to the policy.
  void FeedGoodput(const std::string& name, Job* job);
  nlohmann::json LiveJobsJson() const;   // JobsJson's "jobs", in JobNames() order
  nlohmann::json EndedJobsJson() const;  // JobsJson's "ended", oldest first
  // A job's status fields beyond its membership's: failing, last progress, checkpoint failures.
  void AddHealth(const Job& job, nlohmann::json* out) const;
  // A live trainer of `job` failed (`how`, its last log line `error`): counts failures alike.
  void NoteFailure(const std::string& name, Job* job, const std::string& how,
                   const std::string& error);

  std::unique_ptr<JobMembership> NewMembership(const std::string& name, int port_index) const;
  // Who hands out the nodes' slots. This is the one thing a one-job server does differently, and
  // what follows from it is decided here once:
  //  - kToTheOneJob (a one-job server): every slot of every node is the one job's, and its size
  //    follows its own flags. So nodes need not offer job types, nothing can be submitted or
  //    cancelled, no slot is free for a service's teachers, and the cluster policy has no part.
  //  - kByPolicy (a cluster server): the ClusterPolicy shares the nodes among submitted jobs.
  // Two more one-job defaults are about the job itself, not the slots: it ends with its server
  // (it is never forgotten as finished), and its status and events log are the job's own.
  enum class SlotsGo { kToTheOneJob, kByPolicy };
  bool by_policy() const { return slots_go_ == SlotsGo::kByPolicy; }
  Job* Own();

  // Runs after every input: applies the policy's decisions, then collects every job's actions.
  void AfterPolicy();
  // A trainer's configuration fingerprint ("config" event): the job's, or a joiner's refusal.
  void OnConfig(Job* job, const std::string& trainer_id, const std::string& node,
                const std::string& config);
  // The one job: every node's slots.
  void GrantEverySlot(const std::string& reason);
  // Gives up the slots the policy took from the job (`grow` false), or takes the free slots it
  // gave (`grow` true), and hands the job its slots when they changed.
  void ApplyPlacement(const std::string& name, Job* job, const std::string& reason, bool grow);
  std::vector<SlotGrant> Grants(const Job& job) const;
  void Forget(const std::string& name, const std::string& state);
  void Collect(const std::string& name, Job* job);
  // An events-log record of the server's own log (an events.h struct).
  template <typename E>
  void Record(const E& e) {
    actions_.push_back({"", Action::Record(e)});
  }
  void KillStale(const std::string& node, std::vector<std::string> ids);

  const ClusterOptions options_;
  Clock* const clock_;         // not owned
  const std::string own_job_;  // empty on a cluster server
  const SlotsGo slots_go_;
  NodeRegistry registry_;
  ClusterPolicy policy_;
  uint64_t trainer_seq_ = 1;  // shared by every job (MembershipOptions::shared_trainer_seq)
  std::map<std::string, Job> jobs_;
  std::map<std::string, std::map<int, std::string>> owner_;  // node -> slot -> the job holding it
  std::deque<EndedJob> finished_;                            // ended jobs, oldest first
  std::vector<JobAction> actions_;
  std::map<std::string, std::string> reasons_;  // job -> the reason of this pass's change
  // Trainers killed as stale whose exit their node has not reported: id -> node (bounded).
  std::map<std::string, std::string> stale_;
  int submitted_ = 0;
};

}  // namespace edl::jobserver
