#include "jobserver/job_membership.h"

#include <algorithm>
#include <climits>
#include <unordered_map>
#include <unordered_set>

#include <glog/logging.h>

#include "jobserver/events/events.h"

namespace edl::jobserver {

using nlohmann::json;
using proto::kStopReason;
using proto::MemberInfo;

namespace {
constexpr int64_t kQuietResetUs = 60'000'000;  // a minute without failures resets the backoff
}  // namespace

JobMembership::JobMembership(const MembershipOptions& options, Clock* clock)
    : options_(options), clock_(clock) {
  current_.job_id = options_.job_id;
  desired_ = options_.initial_trainers;
}

// ---- inputs

void JobMembership::NodeAttached(const std::string& name, const std::vector<std::string>& running,
                                 const std::vector<int64_t>& generations) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;  // not in this job's allocation
  it->second.connected = true;
  it->second.closed_generation.reset();
  refused_nodes_.erase(name);  // its client reconnected: perhaps with the right configuration
  if (first_node_us_ < 0) first_node_us_ = clock_->NowMicros();
  // Re-attached after a short disconnect: members the client no longer runs have died meanwhile.
  const std::set<std::string> still(running.begin(), running.end());
  if (pending_.active) {
    for (const MemberInfo& j : pending_.joiners) {
      if (j.node == name) {
        AbortPending("node " + name + " reconnected");
        break;
      }
    }
  }
  std::set<std::string> gone;
  // Stale trainers: running here but of a generation above the current one (a change the
  // previous server had not completed), or not this job's on this node.
  std::vector<std::string> stale;
  for (size_t i = 0; i < running.size(); ++i) {
    const bool above = i < generations.size() && generations[i] > current_.generation;
    const MemberInfo* m = FindMember(running[i]);
    if (m != nullptr && m->node != name) continue;  // not this node's to report
    if (pending_.joiner_ids.count(running[i]) > 0) continue;
    if (!above && (m != nullptr || leaving_.count(running[i]) > 0))
      continue;  // a member, or a leaver
    stale.push_back(running[i]);
    if (m != nullptr) gone.insert(running[i]);
  }
  if (!stale.empty()) {
    LOG(WARNING) << "job " << options_.job_id << ": node " << name << " runs " << stale.size()
                 << " trainer(s) that are in no generation of this job (a change the previous "
                    "server had not "
                    "completed): killing them";
    EmitEvent(events::StaleTrainers{name, stale, current_.generation});
    EmitKill(name, stale);
  }
  for (const MemberInfo& m : current_.members) {
    if (m.node == name && still.count(m.trainer_id) == 0 && finished_.count(m.trainer_id) == 0) {
      gone.insert(m.trainer_id);
    }
  }
  if (!gone.empty()) {
    NoteMembersFailed(gone, "died while their node was away");  // before they leave stepped_
    RemoveMembers(gone, "failure", true);
  }
  UpdateRecovery();
  Reconcile();
}

void JobMembership::NodeDisconnected(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  it->second.connected = false;
  it->second.closed_generation = current_.generation;
  if (FailMembersOfClosedNodes()) Reconcile();  // a survivor's report came first
}

void JobMembership::NodeLost(const std::string& name, const std::string& why) {
  auto node = nodes_.find(name);
  LOG(WARNING) << "job " << options_.job_id << ": lost node " << name << ": " << why;
  EmitEvent(events::NodeLost{name, why});
  std::set<std::string> gone;
  for (const MemberInfo& m : current_.members) {
    if (m.node == name) gone.insert(m.trainer_id);
  }
  if (pending_.active) {
    for (const MemberInfo& j : pending_.joiners) {
      if (j.node == name) {
        AbortPending("node " + name + " lost");
        break;
      }
    }
  }
  if (node != nodes_.end()) nodes_.erase(node);
  refused_nodes_.erase(name);
  for (auto it = leaving_.begin(); it != leaving_.end();) {  // nobody is left to report them
    it = it->second == name ? leaving_.erase(it) : std::next(it);
  }
  if (!gone.empty()) {
    NoteMembersFailed(gone, "were lost with their node");
    RemoveMembers(gone, "node_loss", true);
  }
  UpdateRecovery();
}

void JobMembership::TrainerExited(const std::string& trainer_id, bool success,
                                  const std::string& how) {
  const std::string id =
      trainer_id;  // a copy: the caller's may live in the generation OnExit replaces
  OnExit(id, success, how);
  leaving_.erase(id);  // its node reported its exit: it no longer runs
}

void JobMembership::OnExit(const std::string& trainer_id, bool success, const std::string& how) {
  if (pending_.active && pending_.joiner_ids.count(trainer_id) > 0) {
    EmitEvent(events::JoinerExit{trainer_id, how});
    DropJoiner(trainer_id);
    if (!success) NoteFailure();
    Reconcile();
    return;
  }
  if (FindMember(trainer_id) == nullptr) return;  // a leaving trainer: expected
  EmitEvent(events::TrainerExit{trainer_id, how, success});
  if (!success && !finished_.empty()) {
    // Finishing: members train in lockstep, so one that exited 0 means training is complete. A
    // failure now (e.g. rank 0's final save) re-forms nothing: a generation would restart members
    // that already finished. It is recorded, and the job finishes once every member has exited.
    LOG(WARNING) << "job " << options_.job_id << ": trainer " << trainer_id << " failed (" << how
                 << ") after other members finished training; the job finishes without re-forming";
    EmitEvent(events::FailedWhileFinishing{trainer_id, how});
  }
  if (success || !finished_.empty()) {
    finished_.insert(trainer_id);
    Reconcile();
    return;
  }
  const std::set<std::string> gone = {trainer_id};
  NoteMembersFailed(gone, "failed (" + how + ")");
  RemoveMembers(gone, "failure", true);
  Reconcile();
}

void JobMembership::ReformFailed(const std::string& trainer_id, int64_t generation) {
  if (done_ || recovering_ || stopping_ || current_.members.empty()) return;
  if (generation != current_.generation || FindMember(trainer_id) == nullptr) return;
  if (!finished_.empty()) {
    CommitFinish("trainer " + trainer_id + " could not re-form generation " +
                 std::to_string(generation) + " after other members finished");
    Reconcile();
    return;
  }
  failed_report_ = {generation, trainer_id};
  if (FailMembersOfClosedNodes()) {  // the members it could not re-form with are gone with their
                                     // node
    Reconcile();
    return;
  }
  const int64_t now = clock_->NowMicros();
  if (last_reform_retry_us_ >= 0 && now - last_reform_retry_us_ < options_.backoff_min_us) return;
  last_reform_retry_us_ = now;
  LOG(WARNING) << "job " << options_.job_id << ": trainer " << trainer_id
               << " could not re-form generation " << generation
               << "; committing its members again";
  if (pending_.active) AbortPending("the current generation failed to re-form");
  Commit(current_.members, "reform_retry", true, 0);
}

void JobMembership::CommFailed(const std::string& trainer_id, int64_t generation) {
  // An older generation counts too: a trainer's exit can commit the next generation (and its
  // grow-back) before a survivor's report about the one that failed arrives.
  if (generation > current_.generation || generation <= failed_report_.generation) return;
  if (FindMember(trainer_id) == nullptr) return;
  failed_report_ = {generation, trainer_id};
  if (FailMembersOfClosedNodes()) Reconcile();
}

bool JobMembership::FailMembersOfClosedNodes() {
  if (done_ || recovering_ || stopping_ || !finished_.empty()) return false;
  const MemberInfo* reporter = FindMember(failed_report_.trainer_id);
  if (reporter == nullptr) return false;
  if (auto n = nodes_.find(reporter->node); n == nodes_.end() || n->second.closed_generation)
    return false;
  std::map<std::string, std::vector<std::string>> by_node;
  std::set<std::string> gone;
  for (const MemberInfo& m : current_.members) {
    auto n = nodes_.find(m.node);
    // A failure before the node closed is not its members' (they formed the generations after).
    if (n == nodes_.end() || !n->second.closed_generation ||
        failed_report_.generation < *n->second.closed_generation) {
      continue;
    }
    by_node[m.node].push_back(m.trainer_id);
    gone.insert(m.trainer_id);
  }
  if (gone.empty()) return false;
  for (auto& [node, ids] : by_node) {
    LOG(WARNING)
        << "job " << options_.job_id << ": node " << node << " lost its connection and trainer "
        << failed_report_.trainer_id << " could not complete generation "
        << failed_report_.generation << ": taking the node's " << ids.size()
        << " member(s) as dead now, without waiting for its client to re-attach or time out";
    EmitEvent(events::MembersLostWithNode{node, std::move(ids), failed_report_.generation,
                                          failed_report_.trainer_id});
  }
  NoteMembersFailed(gone, "died with their node's client");
  RemoveMembers(gone, "failure", true);
  return true;
}

void JobMembership::TrainerStepped(const std::string& trainer_id) {
  if (FindMember(trainer_id) == nullptr) return;
  stepped_.insert(trainer_id);
  unstepped_joiners_.erase(trainer_id);
}

void JobMembership::CommitFinish(const std::string& why) {
  // Finishing: members train in lockstep, so training is complete, and the members that cannot
  // re-form (joiners of a change that raced the end: their peers had finished) have nothing left
  // to do. A generation of the finished members alone lets them leave in place (exit 0), and the
  // job finishes; committing them all again would wait on peers that are gone.
  std::vector<MemberInfo> done_members;
  for (const MemberInfo& m : current_.members) {
    if (finished_.count(m.trainer_id) > 0) done_members.push_back(m);
  }
  LOG(INFO) << "job " << options_.job_id << ": " << why << "; the "
            << current_.members.size() - done_members.size() << " unfinished member(s) leave";
  if (pending_.active) AbortPending("the job is finishing");
  Commit(std::move(done_members), "finish", false, 0);
}

void JobMembership::TrainerReady(const std::string& trainer_id, int64_t generation) {
  if (!pending_.active || generation != pending_.generation) return;
  if (pending_.joiner_ids.count(trainer_id) == 0) return;
  pending_.ready.insert(trainer_id);
  // O(log n) per report until the last one: a large growth gets thousands of them.
  if (pending_.ready.size() < pending_.joiners.size()) return;
  MaybeCommitPending(false);
  Reconcile();
}

void JobMembership::RefuseJoiner(const std::string& trainer_id, const std::string& why) {
  auto it = pending_.joiner_ids.find(trainer_id);
  if (!pending_.active || it == pending_.joiner_ids.end()) return;
  const std::string id = trainer_id, node = it->second;
  LOG(WARNING) << "job " << options_.job_id << ": refusing joiner " << id << " on node " << node
               << ": " << why << "; no joiner goes to node " << node
               << " until its client re-attaches";
  EmitEvent(events::JoinerRefused{id, node, why});
  refused_nodes_[node] = why;
  EmitKill(node, {id});
  DropJoiner(id);
  NoteFailure();
  Reconcile();
}

Status JobMembership::CheckSize(int n) const {
  const int lo = options_.min_trainers, hi = options_.max_trainers;
  if (n >= lo && (hi <= 0 || n <= hi)) return Status::OK();
  return Status::InvalidArgument(
      "job " + options_.job_id + " takes " + std::to_string(lo) + ".." +
      (hi > 0 ? std::to_string(hi) : "any") +
      " trainers (the server's --min_trainers / --max_trainers), not " + std::to_string(n) +
      (n < lo ? "; to end the job use `edl ctl stop`"
              : "; restart the server with a larger --max_trainers to go further"));
}

void JobMembership::SetDesired(int n, const std::string& reason) {
  desired_ = std::max(0, n);
  desired_reason_ = reason;
  need_grow_back_ = false;
  EmitEvent(events::Desired{desired_, reason});
  Reconcile();
}

void JobMembership::AddDesired(int delta, const std::string& reason) {
  const int base = desired_ > 0 ? desired_ : current_.world_size();
  SetDesired(std::max(desired_ > 0 || delta > 0 ? 1 : 0, base + delta), reason);
}

void JobMembership::KillTrainers(int k) {
  std::map<std::string, std::vector<std::string>> by_node;
  std::vector<std::string> killed;
  for (auto it = current_.members.rbegin(); it != current_.members.rend() && k > 0; ++it) {
    if (finished_.count(it->trainer_id)) continue;
    by_node[it->node].push_back(it->trainer_id);
    killed.push_back(it->trainer_id);
    --k;
  }
  for (auto& [node, ids] : by_node) EmitKill(node, std::move(ids));
  EmitEvent(events::Kill{std::move(killed)});
}

void JobMembership::KillAllTrainers() {
  std::set<std::string> gone;
  for (const MemberInfo& m : current_.members) {
    if (finished_.count(m.trainer_id) == 0) gone.insert(m.trainer_id);
  }
  if (gone.empty()) return;
  KillTrainers(static_cast<int>(current_.members.size()));
  RemoveMembers(gone, "failure", true);
  NoteFailure();
  Reconcile();
}

bool JobMembership::Stop(const std::string& by, std::vector<MemberInfo>* leaving) {
  if (stopping_ || done_ || current_.members.empty()) return false;
  AbortPending("the job is stopping");
  for (const MemberInfo& m : current_.members) {
    if (finished_.count(m.trainer_id) == 0) leaving->push_back(m);
  }
  EmitEvent(events::Stop{by, current_.generation, leaving->size()});
  Commit({}, kStopReason, false, 0);
  stopping_ = true;
  return true;
}

void JobMembership::SetAllocation(const std::vector<SlotGrant>& grants, const std::string& reason,
                                  std::optional<int> desired) {
  const int64_t now = clock_->NowMicros();
  std::set<std::pair<std::string, int>> allowed;
  for (auto& [name, n] : nodes_)
    n.slots.clear();  // a node not granted keeps none (its members leave)
  for (const SlotGrant& g : grants) {
    Node& n = nodes_[g.node];
    n.name = g.node;
    n.host = g.host;
    n.restart_mode = g.restart_mode;
    n.slots = g.slots;
    n.connected = g.connected;
    n.order = g.order;
    if (g.connected && first_node_us_ < 0) first_node_us_ = now;
    for (int s : g.slots) allowed.emplace(g.node, s);
  }
  if (pending_.active) {
    for (const MemberInfo& j : pending_.joiners) {
      if (!allowed.count({j.node, j.slot})) {
        AbortPending("its slots were given to another job");
        break;
      }
    }
  }
  std::set<std::string> gone;
  for (const MemberInfo& m : current_.members) {
    if (!allowed.count({m.node, m.slot}) && !finished_.count(m.trainer_id))
      gone.insert(m.trainer_id);
  }
  if (desired) {
    desired_ = *desired;
    desired_reason_ = reason;
    EmitEvent(events::Desired{desired_, reason});
  }
  if (!gone.empty()) RemoveMembers(gone, reason, false);
  Reconcile();
}

void JobMembership::Tick() {
  const int64_t now = clock_->NowMicros();
  UpdateRecovery();
  if (pending_.active && now - pending_.started_us >= options_.join_timeout_us) {
    MaybeCommitPending(true);
  }
  Reconcile();
}

std::vector<Action> JobMembership::TakeActions() {
  std::vector<Action> out;
  out.swap(actions_);
  return out;
}

// ---- decisions

int JobMembership::target() const {
  int want = desired_ > 0 ? desired_ : INT_MAX;
  if (options_.max_trainers > 0) want = std::min(want, options_.max_trainers);
  want = std::max(want, options_.min_trainers);
  // O(members + slots): occupied slots grouped by node, then each connected node's free ones.
  int avail = current_.world_size() + static_cast<int>(pending_.joiners.size());
  std::unordered_map<std::string, std::vector<int>> occupied;
  for (const MemberInfo& m : current_.members) occupied[m.node].push_back(m.slot);
  for (const MemberInfo& m : pending_.joiners) occupied[m.node].push_back(m.slot);
  for (const auto& [name, n] : nodes_) {
    if (!n.connected || refused_nodes_.count(name)) continue;  // no joiner goes there
    auto it = occupied.find(name);
    for (int s : n.slots) {
      const bool taken = it != occupied.end() &&
                         std::find(it->second.begin(), it->second.end(), s) != it->second.end();
      avail += taken ? 0 : 1;
    }
  }
  return std::min(want, avail);
}

void JobMembership::Reconcile() {
  if (done_ || recovering_ || stopping_) return;
  if (!current_.members.empty() && !finished_.empty()) {
    bool all_finished = true, only_unstepped_joiners = true;
    for (const MemberInfo& m : current_.members) {
      if (finished_.count(m.trainer_id) > 0) continue;
      all_finished = false;
      only_unstepped_joiners &= unstepped_joiners_.count(m.trainer_id) > 0;
    }
    if (!all_finished && !only_unstepped_joiners) return;  // finishing: no more changes
    // The joiners of a change that raced the end would wait out their rendezvous on peers that
    // finished: they leave now (ReformFailed's "finish" without waiting for their report).
    if (!all_finished)
      CommitFinish(
          "every member that trained has finished, and the rest joined after the last step");
    done_ = true;
    EmitEvent(events::Finished{current_.generation, current_.world_size()});
    Action a;
    a.kind = Action::Kind::kDone;
    Emit(std::move(a));
    return;
  }
  const int cur = current_.world_size();
  const int tgt = target();
  if (pending_.active) {
    if (tgt < cur + static_cast<int>(pending_.joiners.size())) {
      AbortPending("the desired size dropped");
    } else {
      return;
    }
  }
  if (tgt < cur) {
    Shrink(cur - tgt, desired_reason_);
  } else if (tgt > cur) {
    // A job resumed after a stop gathers its size like a first start: nobody trains meanwhile.
    const bool fresh = current_.generation == 0 || current_.reason == kStopReason;
    if (cur == 0 && fresh && !StartBarrierPassed(tgt)) return;
    if (clock_->NowMicros() < grow_blocked_until_us_) return;
    Grow(tgt - cur);
  }
}

bool JobMembership::StartBarrierPassed(int tgt) const {
  // The first generation gathers the initial desired size (clamped to the bounds), waiting at most
  // join_timeout after the first node registered; it never starts below min_trainers.
  if (tgt < options_.min_trainers) return false;
  int want = desired_ > 0 ? desired_ : 0;
  if (options_.max_trainers > 0 && want > options_.max_trainers) want = options_.max_trainers;
  if (tgt >= want) return true;
  return first_node_us_ >= 0 && clock_->NowMicros() - first_node_us_ >= options_.join_timeout_us;
}

void JobMembership::Grow(int count) {
  std::vector<MemberInfo> joiners = FreeSlots(count);
  if (joiners.empty()) return;
  for (MemberInfo& j : joiners) j.trainer_id = NewTrainerId(j.node, j.slot);
  std::string reason = need_grow_back_ ? "grow_back" : desired_reason_;
  if (current_.generation == 0) reason = "start";
  if (current_.members.empty() && current_.reason == kStopReason) reason = "resume";
  if (current_.members.empty()) {  // nobody to keep training meanwhile: no prepare phase
    need_grow_back_ = false;
    Commit(joiners, reason, false, 0);
    return;
  }
  pending_ = Pending();
  pending_.active = true;
  pending_.generation = NextGeneration();
  pending_.started_us = clock_->NowMicros();
  pending_.reason = reason;
  std::map<std::string, proto::Prepare> by_node;
  const int world = current_.world_size() + static_cast<int>(joiners.size());
  for (size_t i = 0; i < joiners.size(); ++i) {
    joiners[i].rank = current_.world_size() + static_cast<int>(i);
    if (nodes_.at(joiners[i].node).restart_mode) {
      pending_.ready.insert(joiners[i].trainer_id);  // restart mode: started at commit
      continue;
    }
    proto::Prepare& p = by_node[joiners[i].node];
    p.generation = pending_.generation;
    p.job_id = options_.job_id;
    p.world_size = world;
    p.master_addr = current_.master_addr;
    p.master_port = options_.master_port_base + static_cast<int>(pending_.generation % 1000);
    p.joiners.push_back(joiners[i]);
  }
  pending_.joiners = joiners;
  for (const MemberInfo& j : joiners) pending_.joiner_ids.emplace(j.trainer_id, j.node);
  for (auto& [node, p] : by_node) {
    Action a;
    a.kind = Action::Kind::kPrepare;
    a.node = node;
    a.prepare = std::move(p);
    Emit(std::move(a));
  }
  EmitEvent(events::Prepare{pending_.generation, reason, joiners.size()});
  MaybeCommitPending(false);
}

void JobMembership::Shrink(int count, const std::string& reason) {
  std::vector<MemberInfo> keep = current_.members;
  keep.resize(keep.size() - std::min<size_t>(count, keep.size()));
  Commit(keep, reason, false, 0);
}

void JobMembership::RemoveMembers(const std::set<std::string>& gone, const std::string& reason,
                                  bool failure) {
  if (pending_.active) AbortPending("a member left during the prepare phase");
  std::vector<MemberInfo> keep;
  for (const MemberInfo& m : current_.members) {
    if (gone.count(m.trainer_id) == 0) keep.push_back(m);
  }
  if (keep.size() == current_.members.size()) return;
  Commit(keep, reason, failure, 0);
}

void JobMembership::AbortPending(const std::string& why) {
  if (!pending_.active) return;
  std::map<std::string, std::vector<std::string>> by_node;
  for (const MemberInfo& j : pending_.joiners) by_node[j.node].push_back(j.trainer_id);
  for (auto& [node, ids] : by_node) {
    if (nodes_.count(node) && nodes_.at(node).restart_mode) continue;  // never started
    EmitKill(node, std::move(ids));
  }
  EmitEvent(events::PrepareAborted{pending_.generation, why});
  pending_ = Pending();
}

void JobMembership::MaybeCommitPending(bool timed_out) {
  if (!pending_.active) return;
  std::vector<MemberInfo> members = current_.members;
  std::map<std::string, std::vector<std::string>> unready;
  for (const MemberInfo& j : pending_.joiners) {
    if (pending_.ready.count(j.trainer_id)) {
      members.push_back(j);
    } else {
      unready[j.node].push_back(j.trainer_id);
    }
  }
  if (!unready.empty() && !timed_out) return;
  const int64_t stall = clock_->NowMicros() - pending_.started_us;
  std::string reason = pending_.reason;
  if (!unready.empty()) {
    reason = "join_timeout";
    for (auto& [node, ids] : unready) EmitKill(node, std::move(ids));
    NoteFailure();  // do not retry at once: the joiners may be broken
  }
  pending_ = Pending();
  if (members.size() > current_.members.size()) {
    need_grow_back_ = false;
    Commit(std::move(members), reason, false, stall);
  }
}

void JobMembership::Commit(std::vector<MemberInfo> members, const std::string& reason, bool failure,
                           int64_t stall_us) {
  proto::GenerationInfo next;
  next.generation = NextGeneration();
  next.job_id = options_.job_id;
  next.reason = reason;
  next.failure = failure;
  std::vector<MemberInfo> kept, replaced, joined;
  std::unordered_set<std::string> before;
  for (const MemberInfo& m : current_.members) before.insert(m.trainer_id);
  for (MemberInfo& m : members) {
    const bool survivor = before.count(m.trainer_id) > 0;
    auto node = nodes_.find(m.node);
    if (survivor && node != nodes_.end() && node->second.restart_mode) {
      m.trainer_id = NewTrainerId(m.node, m.slot);  // restart mode: a new process every generation
      replaced.push_back(m);
    } else if (survivor) {
      kept.push_back(m);
    } else {
      joined.push_back(m);
    }
  }
  if (!current_.members.empty()) {  // joiners of a running job (not its first generation's members)
    for (const MemberInfo& m : joined) unstepped_joiners_.insert(m.trainer_id);
  }
  next.members = std::move(kept);
  next.members.insert(next.members.end(), replaced.begin(), replaced.end());
  next.members.insert(next.members.end(), joined.begin(), joined.end());
  for (size_t i = 0; i < next.members.size(); ++i) next.members[i].rank = static_cast<int>(i);
  std::unordered_set<std::string> after;
  for (const MemberInfo& m : next.members) after.insert(m.trainer_id);
  for (const MemberInfo& m : current_.members) {
    if (after.count(m.trainer_id) == 0)
      MarkLeaving(m.trainer_id, m.node);  // until its exit is reported
  }
  if (!next.members.empty()) next.master_addr = next.members[0].host;
  next.master_port = options_.master_port_base + static_cast<int>(next.generation % 1000);
  EmitEvent(events::Generation{next.generation, reason, failure, current_.world_size(),
                               next.world_size(), MicrosToSeconds(stall_us)});
  LOG(INFO) << "job " << options_.job_id << ": generation " << next.generation << " (" << reason
            << (failure ? ", failure" : "") << "): world size " << current_.world_size() << " -> "
            << next.world_size();
  Action a;
  a.kind = Action::Kind::kCommit;
  a.prev = current_;
  a.next = next;
  SetCurrent(std::move(next));
  Emit(std::move(a));
}

void JobMembership::NoteMembersFailed(const std::set<std::string>& gone, const std::string& what) {
  for (const std::string& id : gone) {
    if (stepped_.count(id) == 0) {
      LOG(INFO) << "job " << options_.job_id << ": trainer " << id << " " << what
                << " before its first step: growing back after the failure back-off";
      NoteFailure();
      return;
    }
  }
  LOG(INFO) << "job " << options_.job_id << ": " << gone.size() << " trainer(s) " << what
            << " after training: growing back at once";
  need_grow_back_ = true;
}

void JobMembership::NoteFailure() {
  const int64_t now = clock_->NowMicros();
  if (backoff_us_ == 0 || now - last_failure_us_ > kQuietResetUs) {
    backoff_us_ = options_.backoff_min_us;
  } else {
    backoff_us_ = std::min(backoff_us_ * 2, options_.backoff_max_us);
  }
  last_failure_us_ = now;
  grow_blocked_until_us_ = now + backoff_us_;
  need_grow_back_ = true;
}

// ---- helpers

void JobMembership::DropJoiner(const std::string& trainer_id) {
  const std::string id = trainer_id;  // a copy: it may be the joiner's own id about to be erased
  auto it = std::find_if(pending_.joiners.begin(), pending_.joiners.end(),
                         [&](const MemberInfo& m) { return m.trainer_id == id; });
  if (it != pending_.joiners.end()) pending_.joiners.erase(it);
  pending_.joiner_ids.erase(id);
  pending_.ready.erase(id);
  if (pending_.joiners.empty()) {
    pending_ = Pending();
  } else {
    MaybeCommitPending(false);  // the others may all be ready
  }
}

void JobMembership::EmitKill(const std::string& node, std::vector<std::string> ids) {
  for (const std::string& id : ids) MarkLeaving(id, node);
  Action a;
  a.kind = Action::Kind::kKill;
  a.node = node;
  a.trainer_ids = std::move(ids);
  Emit(std::move(a));
}

void JobMembership::MarkLeaving(const std::string& id, const std::string& node) {
  stepped_.erase(id);
  unstepped_joiners_.erase(id);
  if (leaving_.size() >= kMaxLeavingTrainers && leaving_.count(id) == 0)
    leaving_.erase(leaving_.begin());
  leaving_[id] = node;
}

std::set<std::pair<std::string, int>> JobMembership::TakenSlots() const {
  std::set<std::pair<std::string, int>> taken;
  for (const MemberInfo& m : current_.members) taken.emplace(m.node, m.slot);
  for (const MemberInfo& m : pending_.joiners) taken.emplace(m.node, m.slot);
  return taken;
}

std::vector<MemberInfo> JobMembership::FreeSlots(int count) const {
  std::vector<const Node*> order;
  for (const auto& [name, n] : nodes_) {
    if (n.connected && refused_nodes_.count(name) == 0) order.push_back(&n);
  }
  std::sort(order.begin(), order.end(),
            [](const Node* a, const Node* b) { return a->order < b->order; });
  std::vector<MemberInfo> out;
  const auto taken = TakenSlots();
  for (const Node* n : order) {
    for (int s : n->slots) {
      if (static_cast<int>(out.size()) >= count) return out;
      if (taken.count({n->name, s})) continue;
      MemberInfo m;
      m.node = n->name;
      m.slot = s;
      m.host = n->host;
      out.push_back(m);
    }
  }
  return out;
}

std::string JobMembership::NewTrainerId(const std::string& node, int slot) {
  const uint64_t seq = TrainerSeq()++;
  std::string id = proto::TrainerId{node, slot, static_cast<int64_t>(seq)}.ToString();
  // The registry bounds node names (proto::CheckNodeName) and slots so that every id is valid.
  DCHECK(proto::IsValidName(id)) << id;
  return id;
}

// ---- state

int JobMembership::total_slots() const {
  int n = 0;
  for (const auto& [name, node] : nodes_)
    n += node.connected ? static_cast<int>(node.slots.size()) : 0;
  return n;
}

int JobMembership::used_slots() const {  // members that finished hold no slot any more
  return current_.world_size() - static_cast<int>(finished_.size()) +
         static_cast<int>(pending_.joiners.size());
}

const MemberInfo* JobMembership::FindMember(const std::string& trainer_id) const {
  auto it = current_index_.find(trainer_id);
  return it == current_index_.end() ? nullptr : &current_.members[it->second];
}

void JobMembership::SetCurrent(proto::GenerationInfo g) {
  current_ = std::move(g);
  current_index_.clear();
  current_index_.reserve(current_.members.size());
  for (size_t i = 0; i < current_.members.size(); ++i)
    current_index_.emplace(current_.members[i].trainer_id, i);
}

bool JobMembership::IsLiveTrainerOf(const std::string& trainer_id, const std::string& node) const {
  if (const MemberInfo* m = FindMember(trainer_id)) return m->node == node;
  auto it = pending_.joiner_ids.find(trainer_id);
  return it != pending_.joiner_ids.end() && it->second == node;
}

bool JobMembership::PlacedOn(const std::string& trainer_id, const std::string& node) const {
  if (IsLiveTrainerOf(trainer_id, node)) return true;
  auto it = leaving_.find(trainer_id);
  return it != leaving_.end() && it->second == node;
}

json JobMembership::Summary() const {
  std::unordered_map<std::string, int> used_on;
  for (const MemberInfo& m : current_.members)
    used_on[m.node] += finished_.count(m.trainer_id) ? 0 : 1;
  json nodes = json::array();
  for (const auto& [name, n] : nodes_) {
    auto u = used_on.find(name);
    const int used = u == used_on.end() ? 0 : u->second;
    nodes.push_back({{"name", name},
                     {"host", n.host},
                     {"mode", proto::NameOf(proto::NodeModeOf(n.restart_mode))},
                     {"slots", n.slots.size()},
                     {"used", used},
                     {"connected", n.connected}});
  }
  json members = json::array();
  for (const MemberInfo& m : current_.members) {
    if (members.size() >= 256) break;
    members.push_back({{"trainer_id", m.trainer_id},
                       {"node", m.node},
                       {"slot", m.slot},
                       {"rank", m.rank},
                       {"finished", finished_.count(m.trainer_id) > 0}});
  }
  json out = {{"job_id", options_.job_id},
              {"generation", current_.generation},
              {"reason", current_.reason},
              {"world_size", current_.world_size()},
              {"desired", desired_},
              {"target", target()},
              {"min_trainers", options_.min_trainers},
              {"max_trainers", options_.max_trainers},
              {"pending", pending_.active},
              {"pending_generation", pending_.active ? pending_.generation : 0},
              {"joiners", pending_.joiners.size()},
              {"total_slots", total_slots()},
              {"used_slots", used_slots()},
              {"finished", finished_.size()},
              {"running", current_.world_size() - static_cast<int>(finished_.size())},
              {"done", done_},
              {"nodes", nodes},
              {"members", members}};
  if (!refused_nodes_.empty())
    out["refused_nodes"] = refused_nodes_;  // node -> why its joiner was refused
  return out;
}

// ---- durable state (jobserver/state/STATE.md)

int64_t JobMembership::max_generation() const {
  return std::max(
      {generation_floor_, current_.generation, pending_.active ? pending_.generation : 0});
}

void JobMembership::Snapshot(JobState* s) const {
  s->job_id = options_.job_id;
  s->max_generation = max_generation();
  s->current = current_;
  s->finished.assign(finished_.begin(), finished_.end());
  s->done = done_;
  s->next_trainer_seq = next_trainer_seq_;
  s->desired = desired_;
  s->desired_reason = desired_reason_;
  s->need_grow_back = need_grow_back_;
  s->leaving = leaving_;
  s->nodes.clear();  // the cluster's (NodeRegistry)
}

void JobMembership::Restore(const JobState& s, const std::vector<SlotGrant>& grants) {
  const int64_t now = clock_->NowMicros();
  proto::GenerationInfo restored = s.current;
  restored.job_id = options_.job_id;
  SetCurrent(std::move(restored));
  finished_ = std::set<std::string>(s.finished.begin(), s.finished.end());
  done_ = s.done;
  next_trainer_seq_ = std::max(next_trainer_seq_, s.next_trainer_seq);
  desired_ = s.desired;
  desired_reason_ = s.desired_reason;
  need_grow_back_ = s.need_grow_back;
  leaving_ = s.leaving;
  RaiseGenerationFloor(s.max_generation);
  pending_ = Pending();
  nodes_.clear();
  for (const SlotGrant& g : grants) {
    nodes_[g.node] = Node{g.node, g.host, g.restart_mode, g.slots, g.connected, g.order};
  }
  first_node_us_ = now;
  // The restored members trained under the previous server.
  for (const MemberInfo& m : current_.members) stepped_.insert(m.trainer_id);
  unstepped_joiners_.clear();
  recovering_ = !done_ && !current_.members.empty();
  EmitEvent(events::JobRestored{current_.generation, current_.world_size(), s.max_generation,
                                nodes_.size(), done_});
  LOG(INFO) << "job " << options_.job_id << ": resumed generation " << current_.generation
            << " (world size " << current_.world_size() << ", " << nodes_.size()
            << " known nodes); new generations start above " << max_generation()
            << (recovering_ ? "; waiting for the members' nodes to re-attach" : "");
  UpdateRecovery();
}

void JobMembership::UpdateRecovery() {
  if (!recovering_) return;
  for (const MemberInfo& m : current_.members) {
    auto it = nodes_.find(m.node);
    if (it != nodes_.end() && !it->second.connected) return;  // still waiting for it
  }
  recovering_ = false;
  EmitEvent(events::Recovered{current_.generation, current_.world_size()});
  LOG(INFO) << "job " << options_.job_id
            << ": every member's node re-attached or was lost; generation " << current_.generation
            << " (world size " << current_.world_size() << ") goes on";
}

}  // namespace edl::jobserver
