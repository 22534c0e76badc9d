// The optimal scheduler: exact minimum of the CIL over a candidate grid, by dynamic programming.
//
// Summation by parts turns the CIL into a sum of per-checkpoint terms:
//   CIL = L(x_n)*M + sum_{k=1..n} N(T_k) * (L(x_{k-1}) - L(x_k)),
// where T_k = (x_k - s)*t_train + k*t_p + t_c depends only on (x_k, k). With
//   f[k][j] = min over schedules whose k-th checkpoint is candidate j of the sum up to k,
//   f[k][j] = min_{i<j} (f[k-1][i] + q*L_i) - q*L_j,   q = N(T(g_j, k)),
// each layer is a lower envelope of lines (slope L_i, intercept f[k-1][i]) queried at q. The
// queries grow with j and, for a non-increasing L (every fitted family that decreases), the slopes
// shrink with i, so a monotone convex-hull deque answers each query in O(1) amortised; any other
// L uses a Li Chao tree over the layer's distinct queries, O(log G) per cell.
//
// Pruning (exact): a checkpoint with N(T_k) = M changes nothing (its term M*(L_{k-1} - L_k) is
// cancelled by the terminal L_n*M), so only cells with N(T(g_j, k)) < M are visited; dominance
// (see OptimalDp) drops states that an earlier layer reached more cheaply. With t_p = 0, T does
// not depend on k and the layers collapse into one.
//
// Work: O(cells), cells <= G*K. The stride rule is in ChooseAndRun.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "schedule_internal.h"

namespace viper {

using schedule_internal::CilModel;
using schedule_internal::Finish;
using schedule_internal::PlanStart;
using schedule_internal::ValidateInputs;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Cost of a Li Chao cell relative to a monotone-hull cell (measured ~5x; rounded up).
constexpr int64_t kLiChaoCostFactor = 8;

// The candidate grid start + stride, start + 2*stride, ... (< e), then e.
struct Grid {
  int64_t start = 0, end = 0, stride = 1, size = 0;
  Grid(int64_t start_, int64_t end_, int64_t stride_)
      : start(start_), end(end_), stride(stride_), size((end_ - start_ - 1) / stride_ + 1) {}
  int64_t at(int64_t j) const { return j == size - 1 ? end : start + (j + 1) * stride; }
  // Number of candidates <= bound.
  int64_t CountUpTo(int64_t bound) const {
    if (bound >= end) return size;
    if (bound <= start) return 0;
    return (bound - start) / stride;
  }
};

// The last candidate j at which the k-th checkpoint still has N(T) < M, i.e. T <= (M-1)*t_infer.
int64_t LastUseful(const ScheduleProblem& p, const Grid& g, int64_t k) {
  const __int128 room = static_cast<__int128>(p.requests - 1) * p.t_infer_ns - p.t_c_ns - static_cast<__int128>(k) * p.t_p_ns;
  if (room < 0) return -1;
  const __int128 bound = p.warmup_end + room / p.t_train_ns;
  return g.CountUpTo(bound > g.end ? g.end : static_cast<int64_t>(bound)) - 1;
}

// Cells of the DP without dominance (an upper bound on the real count): layer m (checkpoint
// k0 + m) spans candidates [m - 1, LastUseful]; one collapsed layer when t_p = 0. Stops counting
// once past `cap`.
int64_t WorstCaseCells(const ScheduleProblem& p, const Grid& g, int64_t k0, int64_t cap) {
  if (p.t_p_ns == 0) return LastUseful(p, g, k0 + 1) + 1;
  int64_t cells = 0;
  for (int64_t m = 1; m <= g.size && cells <= cap; ++m) {
    const int64_t last = LastUseful(p, g, k0 + m);
    if (last < m - 1) break;
    cells += last - (m - 1) + 1;
  }
  return cells;
}

// Smallest stride whose worst-case cell count fits the budget (non-increasing in the stride).
int64_t ChooseStride(const ScheduleProblem& p, int64_t start, int64_t k0, int64_t max_cells) {
  int64_t lo = 1, hi = p.end - start;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (WorstCaseCells(p, Grid(start, p.end, mid), k0, max_cells) <= max_cells) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

struct Line {
  double slope, icpt;
  int32_t from;  // candidate index in the source layer, -1 = the anchor
  double at(double q) const { return icpt + slope * q; }
};

// Lower envelope for lines added with non-increasing slopes and queried at non-decreasing q.
class MonotoneHull {
 public:
  void Reset(size_t capacity) {
    lines_.clear(), head_ = 0;
    lines_.reserve(capacity);
  }
  void Add(const Line& l) {
    if (lines_.size() > head_ && lines_.back().slope == l.slope) {
      if (lines_.back().icpt <= l.icpt) return;
      lines_.pop_back();
    }
    while (lines_.size() >= head_ + 2 && Useless(lines_[lines_.size() - 2], lines_.back(), l)) lines_.pop_back();
    lines_.push_back(l);
    head_ = std::min(head_, lines_.size() - 1);
  }
  const Line& Query(double q) {
    while (head_ + 1 < lines_.size() && lines_[head_ + 1].at(q) <= lines_[head_].at(q)) ++head_;
    return lines_[head_];
  }
  bool empty() const { return lines_.size() <= head_; }

 private:
  // b is never below both a and c (slopes a > b > c): it leaves the envelope.
  static bool Useless(const Line& a, const Line& b, const Line& c) {
    return (c.icpt - a.icpt) * (a.slope - b.slope) <= (b.icpt - a.icpt) * (a.slope - c.slope);
  }
  std::vector<Line> lines_;
  size_t head_ = 0;
};

// Li Chao tree over a sorted list of query points: any insertion order, any slopes.
class LiChao {
 public:
  void Reset(std::vector<int64_t> xs) {
    xs_ = std::move(xs);
    tree_.assign(4 * std::max<size_t>(1, xs_.size()), Line{0, kInf, -2});
    count_ = 0;
  }
  void Add(Line l) {
    ++count_;
    Insert(1, 0, static_cast<int64_t>(xs_.size()) - 1, l);
  }
  bool empty() const { return count_ == 0; }
  const Line& Query(double qd) const {
    const int64_t q = static_cast<int64_t>(qd);
    const size_t pos = std::lower_bound(xs_.begin(), xs_.end(), q) - xs_.begin();
    size_t node = 1, lo = 0, hi = xs_.size() - 1;
    const Line* best = &tree_[1];
    while (true) {
      if (tree_[node].at(qd) < best->at(qd)) best = &tree_[node];
      if (lo == hi) return *best;
      const size_t mid = (lo + hi) / 2;
      if (pos <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
  }

 private:
  void Insert(size_t node, int64_t lo, int64_t hi, Line l) {
    while (true) {
      const int64_t mid = (lo + hi) / 2;
      const double xm = static_cast<double>(xs_[mid]);
      if (l.at(xm) < tree_[node].at(xm)) std::swap(l, tree_[node]);
      if (lo == hi || l.icpt == kInf) return;
      const double xl = static_cast<double>(xs_[lo]), xh = static_cast<double>(xs_[hi]);
      if (l.at(xl) < tree_[node].at(xl)) node = 2 * node, hi = mid;
      else if (l.at(xh) < tree_[node].at(xh)) node = 2 * node + 1, lo = mid + 1;
      else return;
    }
  }
  std::vector<int64_t> xs_;
  std::vector<Line> tree_;
  size_t count_ = 0;
};

// Counts N(T) for consecutive candidates of one layer without a division per cell: T grows by
// stride*t_train from one regular candidate to the next (the final candidate e is recomputed).
class RequestCounter {
 public:
  RequestCounter(const CilModel& m, const Grid& g, int64_t k, int64_t j)
      : m_(m), g_(g), k_(k), ti_(m.problem().t_infer_ns), requests_(m.problem().requests) {
    const int64_t step = g.stride * m.problem().t_train_ns;
    step_q_ = step / ti_, step_r_ = step % ti_;
    Seek(j);
  }
  int64_t Get() const { return std::min(requests_, q_ + (r_ != 0 ? 1 : 0)); }
  void Next() {
    if (++j_ == g_.size - 1) return Seek(j_);
    q_ += step_q_, r_ += step_r_;
    if (r_ >= ti_) r_ -= ti_, ++q_;
  }

 private:
  void Seek(int64_t j) {
    j_ = j;
    const int64_t t = m_.LiveTime(g_.at(j), k_);
    q_ = t / ti_, r_ = t % ti_;
  }
  const CilModel& m_;
  const Grid& g_;
  const int64_t k_, ti_, requests_;
  int64_t step_q_ = 0, step_r_ = 0, j_ = 0, q_ = 0, r_ = 0;
};

// One run of the DP on one grid. Layer m (m >= 1) holds the states whose newest checkpoint is
// the (k0 + m)-th; with t_p = 0 there is one collapsed layer whose sources are its own states.
//
// Dominance (exact, only for a non-increasing L): state (j, k) is dead if some earlier layer
// k' < k reached candidate j at no greater cost, because every continuation from (j, k) costs
// at least as much from (j, k') (later live times, same non-negative loss drops). Dead states
// feed no lines; a layer starts after the first live state of the previous one; the DP stops at
// the first layer with no live state. This leaves about (live layers) x G cells instead of G^2/2.
class OptimalDp {
 public:
  OptimalDp(const CilModel& model, const PlanStart& st, const Grid& grid, bool collapsed, int64_t cell_cap)
      : m_(model), st_(st), g_(grid), collapsed_(collapsed), cap_(cell_cap) {}

  // False if the cells would exceed the cap (the run is then abandoned).
  bool Run();
  std::vector<int64_t> Backtrack() const;
  int64_t cells() const { return static_cast<int64_t>(parents_.size()); }
  bool monotone() const { return monotone_; }

 private:
  struct Layer {
    int64_t first, last;
    size_t offset;     // into parents_
    int64_t first_live;
  };
  int64_t AbsoluteK(size_t m) const { return collapsed_ ? st_.k0 + 1 : st_.k0 + static_cast<int64_t>(m); }
  template <typename Hull>
  void RunLayer(size_t m, Hull& hull);
  std::vector<int64_t> LayerQueries(size_t m) const;

  const CilModel& m_;
  const PlanStart st_;
  const Grid& g_;
  const bool collapsed_;
  int64_t cap_;
  bool monotone_ = true;
  std::vector<double> loss_;      // L at each candidate
  std::vector<double> prev_, cur_; // f of the previous and current layer (inf = dead or absent)
  std::vector<double> best_f_;    // min f over the layers so far, per candidate (dominance)
  std::vector<Layer> layers_;     // layers_[m - 1]
  std::vector<int32_t> parents_;  // per cell: the source candidate in the previous layer, -1 = anchor
  double best_ = kInf;            // best total (relative); the anchor alone = L_a*M
  size_t best_layer_ = 0;
  int64_t best_j_ = -1;
};

template <typename Hull>
void OptimalDp::RunLayer(size_t m, Hull& hull) {
  Layer& layer = layers_[m - 1];
  const bool from_anchor = m == 1 || collapsed_;
  const Layer* src = from_anchor ? nullptr : &layers_[m - 2];
  const std::vector<double>& src_f = collapsed_ ? cur_ : prev_;
  const double total = static_cast<double>(m_.problem().requests);
  if (from_anchor) hull.Add({m_.L(st_.anchor), 0.0, -1});
  const int64_t src_first = src ? src->first : 0, src_last = src ? src->last : layer.last;
  RequestCounter counter(m_, g_, AbsoluteK(m), layer.first);
  parents_.resize(layer.offset + static_cast<size_t>(layer.last - layer.first + 1), -2);
  const int64_t base = static_cast<int64_t>(layer.offset) - layer.first;  // parents_[base + j]
  const bool dominance = monotone_ && !collapsed_;
  for (int64_t j = layer.first; j <= layer.last; ++j, counter.Next()) {
    // Source i = j - 1 joins just before candidate j is queried: every query sees exactly i < j.
    const int64_t i = j - 1;
    if ((!from_anchor || collapsed_) && i >= src_first && i <= src_last && src_f[i] < kInf) {
      hull.Add({loss_[i], src_f[i], static_cast<int32_t>(i)});
    }
    cur_[j] = kInf;
    if (hull.empty()) continue;
    const double q = static_cast<double>(counter.Get());
    const Line& line = hull.Query(q);
    const double f = line.at(q) - q * loss_[j];
    parents_[static_cast<size_t>(base + j)] = line.from;
    const double end_total = f + loss_[j] * total;
    if (end_total < best_) best_ = end_total, best_layer_ = m, best_j_ = j;
    if (dominance) {
      if (!(f < best_f_[j])) continue;  // dominated by an earlier layer: dead
      best_f_[j] = f;
    }
    cur_[j] = f;
    if (layer.first_live < 0) layer.first_live = j;
  }
}

std::vector<int64_t> OptimalDp::LayerQueries(size_t m) const {
  std::vector<int64_t> qs;
  const Layer& layer = layers_[m - 1];
  RequestCounter counter(m_, g_, AbsoluteK(m), layer.first);
  for (int64_t j = layer.first; j <= layer.last; ++j, counter.Next()) qs.push_back(counter.Get());
  qs.erase(std::unique(qs.begin(), qs.end()), qs.end());
  return qs;
}

bool OptimalDp::Run() {
  // Only candidates where the first new checkpoint can still matter: the arrays stay O(cells)
  // even when the grid is far longer than the request stream.
  const int64_t useful = LastUseful(m_.problem(), g_, AbsoluteK(1)) + 1;
  loss_.resize(static_cast<size_t>(std::max<int64_t>(0, useful)));
  double previous = m_.L(st_.anchor);
  for (int64_t j = 0; j < useful; ++j) {
    loss_[j] = m_.L(g_.at(j));
    if (!(loss_[j] <= previous)) monotone_ = false;
    previous = loss_[j];
  }
  // The Li Chao path costs ~log G times more per cell and prunes nothing: a smaller budget.
  if (!monotone_) cap_ = std::max<int64_t>(1, cap_ / kLiChaoCostFactor);
  parents_.reserve(static_cast<size_t>(cap_));  // address space only until touched
  best_ = m_.L(st_.anchor) * static_cast<double>(m_.problem().requests);
  prev_.assign(loss_.size(), kInf);
  cur_.assign(loss_.size(), kInf);
  best_f_.assign(loss_.size(), kInf);
  MonotoneHull mono;
  LiChao lichao;
  for (size_t m = 1;; ++m) {
    const int64_t first = m == 1 || collapsed_ ? 0 : layers_.back().first_live + 1;
    const int64_t last = LastUseful(m_.problem(), g_, AbsoluteK(m));
    if ((m > 1 && (collapsed_ || layers_.back().first_live < 0)) || first > last) break;
    if (cells() + (last - first + 1) > cap_) return false;
    layers_.push_back({first, last, parents_.size(), -1});
    if (monotone_) {
      mono.Reset(loss_.size() + 1);
      RunLayer(m, mono);
    } else {
      lichao.Reset(LayerQueries(m));
      RunLayer(m, lichao);
    }
    std::swap(prev_, cur_);
  }
  return true;
}

std::vector<int64_t> OptimalDp::Backtrack() const {
  std::vector<int64_t> out;
  size_t m = best_layer_;
  int64_t j = best_j_;
  while (j >= 0 && m >= 1) {
    out.push_back(g_.at(j));
    const Layer& layer = layers_[m - 1];
    j = parents_[layer.offset + static_cast<size_t>(j - layer.first)];
    if (!collapsed_) --m;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// One DP run on the grid of `stride`; nullopt if it would exceed the cell budget.
struct Run {
  std::vector<int64_t> schedule;
  int64_t stride = 0, cells = 0;
  bool monotone = true;
};

std::optional<Run> RunDp(const CilModel& model, const PlanStart& st, int64_t stride, int64_t max_cells) {
  const ScheduleProblem& p = model.problem();
  const Grid grid(st.start, p.end, stride);
  OptimalDp dp(model, st, grid, p.t_p_ns == 0, max_cells);
  if (!dp.Run()) return std::nullopt;
  return Run{dp.Backtrack(), stride, dp.cells(), dp.monotone()};
}

// Whether L is non-increasing from the anchor over the useful grid (decides the DP's budget).
bool MonotoneOn(const CilModel& model, const PlanStart& st, const Grid& grid) {
  double previous = model.L(st.anchor);
  const int64_t useful = LastUseful(model.problem(), grid, st.k0 + 1) + 1;
  for (int64_t j = 0; j < useful; ++j) {
    const double l = model.L(grid.at(j));
    if (!(l <= previous)) return false;
    previous = l;
  }
  return true;
}

int64_t PowerOfTwoAtLeast(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// The stride rule. `worst` (the smallest stride whose worst-case cell count fits) always fits.
// When it is > 1, a probe at the power of two P >= worst measures the cells that dominance
// really leaves; they scale about as 1/stride, so the finest power of two predicted to use <= 80%
// of the budget is tried next (once more at twice that stride if the prediction was short). The
// grids are nested, so a finer run that fits is never worse than the probe.
Result<Run> ChooseAndRun(const CilModel& model, const PlanStart& st, int64_t max_cells) {
  int64_t worst = ChooseStride(model.problem(), st.start, st.k0, max_cells);
  if (!MonotoneOn(model, st, Grid(st.start, model.problem().end, worst))) {
    worst = ChooseStride(model.problem(), st.start, st.k0, std::max<int64_t>(1, max_cells / kLiChaoCostFactor));
  }
  if (worst == 1) {
    std::optional<Run> run = RunDp(model, st, 1, max_cells);
    if (run) return *run;
    return Status::Internal("optimal schedule: stride 1 exceeded its worst-case cell bound");
  }
  const int64_t probe_stride = PowerOfTwoAtLeast(worst);
  std::optional<Run> probe = RunDp(model, st, probe_stride, max_cells);
  if (!probe) return Status::Internal("optimal schedule: the worst-case stride exceeded its cell budget");
  if (!probe->monotone) return *probe;  // no dominance: finer grids would not fit
  const double predicted = static_cast<double>(probe_stride) * static_cast<double>(probe->cells) / (0.8 * max_cells);
  for (int64_t stride = PowerOfTwoAtLeast(static_cast<int64_t>(std::ceil(predicted))), tries = 0;
       stride < probe_stride && tries < 2; stride *= 2, ++tries) {
    std::optional<Run> fine = RunDp(model, st, stride, max_cells);
    if (fine) return *fine;
  }
  return *probe;
}

}  // namespace

Result<Schedule> OptimalSchedule(const ScheduleInputs& in) {
  VIPER_ASSIGN_OR_RETURN(PlanStart st, ValidateInputs(in));
  const ScheduleProblem& p = in.problem;
  // Back-pointers are int32 candidate indices, and no index exceeds the cell count.
  if (in.optimal.max_cells < 1 || in.optimal.max_cells > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(
        fmt::format("optimal schedule: max_cells = {} must be in [1, 2^31 - 1]", in.optimal.max_cells));
  }
  if (st.start >= p.end) return Finish(in, "optimal", {});
  const CilModel model(p, in.curve);
  VIPER_ASSIGN_OR_RETURN(Run run, ChooseAndRun(model, st, in.optimal.max_cells));
  VIPER_ASSIGN_OR_RETURN(Schedule out, Finish(in, "optimal", std::move(run.schedule)));
  out.stride = run.stride;
  out.dp_cells = run.cells;
  return out;
}

}  // namespace viper
