// Cluster: many jobs on one pool of nodes (`edl server --cluster`; README, "Many jobs on one
// cluster"; docs/ARCHITECTURE.md, "Many jobs: the cluster policy"). Like the Scheduler it is pure:
// no sockets, no threads, time from an injected Clock; the server turns its actions into frames.
//
// Nodes join the cluster (slots, and the job types their own client configuration offers), not a
// job. Jobs are submitted (JobSpec), scaled, cancelled. The ClusterPolicy decides how many trainers
// each job gets on each node; the Cluster turns those counts into concrete slots (a job keeps the
// slots its trainers hold; it gives up first the slots where none of its trainers runs, then the
// slots of its highest ranks) and hands each job's Scheduler its slots (Scheduler::SetAllocation).
// Each job has its own Scheduler, so its own generations, two-phase growth and in-place shrink;
// a job that shrinks keeps its surviving trainers running (they re-form in place).
//
// A slot given up by one job may still hold that job's leaving trainer for a moment; the node's
// client starts the next job's trainer there once it has exited.
//
// Trainer ids are unique across jobs (one counter for every job's Scheduler), so a node's report
// about a trainer is routed by the id alone (JobOfTrainer).
//
// Thread-safety: none; the server's io_context thread only.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "edl/base/clock.h"
#include "edl/base/status.h"
#include "jobserver/cluster_policy.h"
#include "jobserver/cluster_state.h"
#include "jobserver/job_spec.h"
#include "jobserver/scheduler.h"

namespace edl::jobserver {

struct ClusterOptions {
  ClusterPolicyOptions policy;
  // Per-job scheduler settings (heartbeat and join timeouts, backoff, master ports); job_id and
  // the sizes are the submission's.
  SchedulerOptions job_defaults;
  // Submissions may set checkpoint_dir only under this absolute path; empty: they may not set it.
  std::string checkpoint_root;
  size_t max_finished_kept = 100;  // finished and cancelled jobs listed by `edl ctl jobs`
};

struct ClusterNode {
  std::string name, host;
  bool restart_mode = false;
  std::vector<int> slots;
  std::vector<JobTypeOffer> types;
};

// One action of one job's Scheduler (Action::kind as there), or a cluster-level record
// (job empty, kind kEvent: a policy decision for the events log).
struct JobAction {
  std::string job;
  Action action;
};

class Cluster {
 public:
  Cluster(ClusterOptions options, Clock* clock);

  // ---- nodes
  // A node's client registered (after the server authenticated it). A node the cluster still
  // holds (a re-attach) keeps its slots; `running` (ids) are the trainers its client still runs:
  // those of no live job are killed, each job's missing members count as failed. `generations`
  // (empty: unknown) is parallel to `running`: the generation each trainer is in, as in
  // Scheduler::AddNode.
  Status AddNode(const ClusterNode& node, const std::vector<std::string>& running,
                 const std::vector<int64_t>& generations = {});
  void NodeDisconnected(const std::string& name);
  void Heartbeat(const std::string& name);
  bool HasNode(const std::string& name) const { return nodes_.count(name) > 0; }

  // ---- jobs (ctl)
  // Checks the spec (CheckJobSpec against the live nodes' offers) and submits it to the policy.
  Status Submit(const JobSpec& spec);
  // Stops the job in one generation without its trainers (reason "stop", no failure); its slots
  // go to the other jobs; it is listed as cancelled.
  Status Cancel(const std::string& name);
  Status Scale(const std::string& name, int n);

  // ---- a node's reports, routed by trainer id
  // The live job that placed `trainer_id` on `node` ("" when none: a trainer of a finished or
  // cancelled job, or not this node's).
  std::string JobOfTrainer(const std::string& trainer_id, const std::string& node) const;
  void TrainerExited(const std::string& trainer_id, const std::string& node, bool success,
                     const std::string& how);
  void TrainerReady(const std::string& trainer_id, const std::string& node, int64_t generation);

  void Tick();  // heartbeats, the policy's timers, each job's scheduler
  // Takes every action since the last call, in order.
  std::vector<JobAction> TakeActions();

  // ---- state
  // A live (pending or running) job's scheduler, or null.
  const Scheduler* FindJob(const std::string& name) const;
  const JobSpec* FindSpec(const std::string& name) const;
  // Every live job's name, by submission order.
  std::vector<std::string> JobNames() const;
  const ClusterPolicy& policy() const { return policy_; }
  // The jobs' type and settable flags as the live nodes offer them (merged by type).
  std::map<std::string, JobTypeOffer> Offers() const;
  // Jobs whose type node `name` offers (the node needs their type and flags to run them).
  std::vector<std::string> JobsFor(const std::string& node) const;
  // Whether live job `job` holds slots on `node` (its trainers there may use its rendezvous KV).
  bool Hosts(const std::string& node, const std::string& job) const {
    auto it = jobs_.find(job);
    return it != jobs_.end() && it->second.slots.count(node) > 0;
  }
  int submitted_jobs() const { return submitted_; }
  nlohmann::json JobsJson() const;  // for `edl ctl jobs`

  // ---- durable state (jobserver/STATE.md, "A cluster server")
  // Everything a restarted server needs to resume every job (the nodes' session tokens are the
  // server's: left empty).
  void Snapshot(ClusterState* s) const;
  // Resumes a saved cluster on a fresh Cluster: its nodes known but disconnected (one heartbeat
  // timeout of grace on top of the usual one), each job at its placement with its Scheduler
  // restored (Scheduler::Restore: survivors are adopted as their nodes re-attach, numbers go on
  // above the saved ones). Corruption when the jobs' slots do not fit the nodes.
  Status Restore(const ClusterState& s);

 private:
  struct Job {
    JobSpec spec;
    std::unique_ptr<Scheduler> scheduler;
    std::map<std::string, std::vector<int>> slots;  // node -> the slots it holds there
    int port_index = 0;  // MASTER_PORT range: job_defaults.master_port_base + 1000 * port_index
  };
  struct Node {
    ClusterNode info;
    bool connected = true;
    int64_t last_heard_us = 0;
    std::map<int, std::string> owner;  // slot -> job holding it
    int order = 0;                     // join order
  };

  std::unique_ptr<Scheduler> NewScheduler(const std::string& name, int port_index);

  // Runs after every policy input: applies the decisions, then collects every scheduler's actions.
  void AfterPolicy();
  // Gives up the slots the policy took from the job (`grow` false), or takes the free slots it
  // gave (`grow` true), and hands the job's scheduler its slots when they changed.
  void ApplyPlacement(const std::string& name, Job* job, const std::string& reason, bool grow);
  void Forget(const std::string& name, const std::string& state);
  void Collect(const std::string& name, Job* job);
  void Record(nlohmann::json event);

  const ClusterOptions options_;
  Clock* const clock_;  // not owned
  ClusterPolicy policy_;
  uint64_t trainer_seq_ = 1;  // shared by every job's Scheduler (SchedulerOptions)
  std::map<std::string, Node> nodes_;
  std::map<std::string, Job> jobs_;
  std::deque<nlohmann::json> finished_;  // {name, type, state, generation} of ended jobs
  std::vector<JobAction> actions_;
  std::map<std::string, std::string> reasons_;  // job -> the reason of this pass's change
  int submitted_ = 0;
  int next_node_order_ = 0;
};

}  // namespace edl::jobserver
