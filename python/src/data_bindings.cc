// The data side of viper._viper: sample sources, record files, the Prefetcher and the
// RehearsalBuffer (include/viper/{sample_source,record_file,prefetch,rehearsal}.h). The thin Python
// side, with the torch IterableDataset and the DataLoader drop-in, is python/viper/data.py.
//
// Samples cross into Python without a copy: each one is a uint8 numpy array whose memory is the
// prefetcher's 64-byte aligned buffer, owned by the array (torch.from_numpy keeps sharing it).
// Stacking a batch into one array is one memcpy per sample, made without the GIL. Waits release
// the GIL and wake every 100 ms to let Ctrl-C through.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "options.h"
#include "viper/prefetch.h"
#include "viper/record_file.h"
#include "viper/rehearsal.h"
#include "viper/sample_cache.h"
#include "viper/sample_source.h"

namespace viper_py {
namespace {

using viper::Status;
using namespace std::chrono_literals;

OptionsTable<viper::PrefetchOptions> PrefetchOptionsTable() {
  using O = viper::PrefetchOptions;
  OptionsTable<O> t;
  t.Plain("epochs", &O::epochs, "epochs to deliver; 0 = endless")
      .Plain("shuffle", &O::shuffle, "a fresh permutation per epoch")
      .Plain("seed", &O::seed, "seed of the permutations")
      .Plain("ordered", &O::ordered, "deliver in the epoch's order (else as reads complete)")
      .Plain("rank", &O::rank, "this data-parallel rank: takes positions rank, rank + world_size, ... of each epoch")
      .Plain("world_size", &O::world_size, "data-parallel ranks sharing each epoch (1: this process reads it all)")
      .Plain("readers", &O::readers, "reader threads to start with")
      .Plain("buffer_samples", &O::buffer_samples, "samples read ahead to start with")
      .Plain("autotune", &O::autotune, "move readers and buffer_samples online")
      .Plain("max_readers", &O::max_readers, "the tuner's thread cap")
      .Plain("max_buffer_samples", &O::max_buffer_samples, "the tuner's cap on samples read ahead")
      .Plain("max_buffer_bytes", &O::max_buffer_bytes, "memory cap of the samples read ahead")
      .Seconds("tune_interval", &O::tune_interval, "seconds per tuner decision, at least")
      .Named("on_error", &O::on_error, viper::ParseOnError, viper::on_error_name,
             "fail: a bad sample fails the prefetcher; skip: it is skipped and counted");
  return t;
}

OptionsTable<viper::DirectorySourceOptions> DirectoryOptionsTable() {
  using O = viper::DirectorySourceOptions;
  OptionsTable<O> t;
  t.Path("dir", &O::dir, "the directory tree of sample files")
      .Plain("labels_from_subdirs", &O::labels_from_subdirs, "label = index of the top-level subdirectory")
      .Plain("sample_bytes", &O::sample_bytes, "every sample must have this many bytes; 0 = any")
      .Plain("max_sample_bytes", &O::max_sample_bytes, "a larger file is a bad sample")
      .Plain("skip_hidden", &O::skip_hidden, "leave out names starting with '.'");
  return t;
}

OptionsTable<viper::RehearsalOptions> RehearsalOptionsTable() {
  using O = viper::RehearsalOptions;
  OptionsTable<O> t;
  t.Plain("capacity", &O::capacity, "samples kept")
      .Named("policy", &O::policy, viper::ParseRehearsalPolicy, viper::rehearsal_policy_name,
             "reservoir or class_balanced")
      .Plain("seed", &O::seed, "seed of the sampler and of draws")
      .Plain("sample_bytes", &O::sample_bytes, "every sample has this many bytes; 0 = any")
      .Path("spill_dir", &O::spill_dir, "directory of spill() and of the restore at open; empty = none")
      .Plain("restore", &O::restore, "restore from spill_dir at open when a spill is there");
  return t;
}

// A uint8 array that owns the sample's buffer (no copy).
py::array SampleArray(viper::SampleBuffer bytes) {
  auto* owned = new viper::SampleBuffer(std::move(bytes));
  py::capsule base(owned, [](void* p) { delete static_cast<viper::SampleBuffer*>(p); });
  return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(owned->size())}, {1}, owned->data(), base);
}

py::tuple SampleTuple(viper::Sample s) {
  int64_t label = s.label;
  uint64_t id = s.id;
  return py::make_tuple(SampleArray(std::move(s.bytes)), label, id);
}

struct SourceHandle {
  std::shared_ptr<const viper::SampleSource> source;
};

uint64_t Checked(const SourceHandle& h, uint64_t id) {
  if (id >= h.source->size()) {
    throw py::index_error("sample id " + std::to_string(id) + " out of range: the source has " +
                          std::to_string(h.source->size()) + " samples");
  }
  return id;
}

struct PrefetcherHandle {
  std::shared_ptr<viper::Prefetcher> p;
  bool pending_end = false;  // a batch stopped at the epoch's end: the next call reports the end

  explicit PrefetcherHandle(std::unique_ptr<viper::Prefetcher> prefetcher) : p(std::move(prefetcher)) {}
  PrefetcherHandle(PrefetcherHandle&&) = default;
  // Collected without close(): the readers are joined without the GIL, which a reader inside a
  // callable source's read() needs to finish it (holding it here, the process hung).
  ~PrefetcherHandle() {
    if (!p) return;
    if (PyGILState_Check() == 0) {
      p.reset();
      return;
    }
    py::gil_scoped_release release;
    p.reset();
  }

  viper::Prefetcher& live() {
    if (!p) Raise(Status::FailedPrecondition("Prefetcher is closed"));
    return *p;
  }
  std::optional<viper::Sample> Next(std::optional<double> timeout) {
    live();
    if (std::exchange(pending_end, false)) return std::nullopt;
    return Unwrap(WaitInSlices(timeout, [&](std::chrono::milliseconds slice) {
      std::shared_ptr<viper::Prefetcher> pf = Held(p, "Prefetcher");  // again each slice: closed meanwhile raises
      py::gil_scoped_release release;
      auto r = pf->Next(slice);
      pf.reset();  // the last reference if closed meanwhile: its readers are joined here, without the GIL
      return r;
    }));
  }
  // Up to n samples of the epoch: fewer at its end, none for the end itself.
  std::vector<viper::Sample> Batch(size_t n) {
    std::vector<viper::Sample> batch;
    batch.reserve(n);
    while (batch.size() < n) {
      std::optional<viper::Sample> s = Next(std::nullopt);
      if (!s) {
        pending_end = !batch.empty();
        break;
      }
      batch.push_back(std::move(*s));
    }
    return batch;
  }
};

py::object StackBatch(std::vector<viper::Sample> batch) {
  size_t n = batch.size(), size = batch[0].bytes.size();
  for (const auto& s : batch) {
    if (s.bytes.size() != size) {
      Raise(Status::InvalidArgument("next_batch(stack=True): samples of " + std::to_string(size) + " and " +
                                    std::to_string(s.bytes.size()) + " bytes cannot be stacked; use stack=False"));
    }
  }
  py::array_t<uint8_t> data({n, size});
  py::array_t<int64_t> labels(static_cast<py::ssize_t>(n));
  py::array_t<uint64_t> ids(static_cast<py::ssize_t>(n));
  uint8_t* dst = data.mutable_data();
  int64_t* l = labels.mutable_data();
  uint64_t* id = ids.mutable_data();
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < n; ++i) {
      if (size > 0) std::memcpy(dst + i * size, batch[i].bytes.data(), size);
      l[i] = batch[i].label;
      id[i] = batch[i].id;
    }
  }
  return py::make_tuple(data, labels, ids);
}

py::dict StatsDict(const viper::PrefetchStats& s) {
  py::dict d;
  d["delivered"] = s.delivered;
  d["skipped"] = s.skipped;
  d["last_skip_error"] = s.last_skip_error.empty() ? py::object(py::none()) : py::object(py::str(s.last_skip_error));
  d["bytes_read"] = s.bytes_read;
  d["epoch"] = s.epoch;
  d["consumer_wait_seconds"] = s.consumer_wait_seconds;
  d["readers"] = s.readers;
  d["buffer_samples"] = s.buffer_samples;
  d["ready"] = s.ready;
  d["buffered_bytes"] = s.buffered_bytes;
  d["peak_buffered_bytes"] = s.peak_buffered_bytes;
  d["max_readers"] = s.max_readers;
  d["max_buffer_bytes"] = s.max_buffer_bytes;
  py::list tuner;
  for (const auto& e : s.tuner) {
    py::dict t;
    t["at_seconds"] = e.at_seconds;
    t["readers"] = e.readers;
    t["buffer_samples"] = e.buffer_samples;
    t["wait_fraction"] = e.wait_fraction;
    t["samples_per_second"] = e.samples_per_second;
    t["reason"] = e.reason;
    tuner.append(t);
  }
  d["tuner"] = tuner;
  return d;
}

// A source whose reads are a Python callable read(id) -> a buffer of bytes(id) bytes (e.g. an HTTP
// GET): the reader threads take the GIL for each call (a blocking socket read releases it).
class CallableSource : public viper::SampleSource {
 public:
  CallableSource(py::object read, std::vector<uint64_t> sizes, std::vector<int64_t> labels, std::string name)
      : read_(std::move(read)), sizes_(std::move(sizes)), labels_(std::move(labels)), name_(std::move(name)) {}
  ~CallableSource() override {
    py::gil_scoped_acquire gil;  // the last reference may go on a thread without the GIL
    read_ = py::object();
  }
  uint64_t size() const override { return sizes_.size(); }
  uint64_t bytes(uint64_t id) const override { return sizes_[id]; }
  int64_t label(uint64_t id) const override { return labels_.empty() ? -1 : labels_[id]; }
  std::string Describe(uint64_t id) const override { return "sample " + std::to_string(id) + " (" + name_ + ")"; }
  Status ReadInto(uint64_t id, std::span<std::byte> dst) const override {
    py::gil_scoped_acquire gil;
    try {
      py::object got = read_(id);
      py::buffer_info info = py::buffer(got).request();
      size_t n = static_cast<size_t>(info.size * info.itemsize);
      if (n != dst.size()) {
        return Status::Corruption(Describe(id) + ": read returned " + std::to_string(n) + " bytes, expected " +
                                  std::to_string(dst.size()));
      }
      std::memcpy(dst.data(), info.ptr, n);
      return Status::OK();
    } catch (py::error_already_set& e) {
      return Status(viper::StatusCode::kIOError, Describe(id) + ": " + e.what());
    } catch (const std::exception& e) {
      return Status(viper::StatusCode::kIOError, Describe(id) + ": " + e.what());
    }
  }

 private:
  py::object read_;
  std::vector<uint64_t> sizes_;
  std::vector<int64_t> labels_;
  std::string name_;
};

void BindSources(py::module_& m) {
  BindOptions(m, "_DirectorySourceOptions", "viper.data.open_source", DirectoryOptionsTable());
  py::class_<SourceHandle>(m, "_Source")
      .def("__len__", [](const SourceHandle& h) { return h.source->size(); })
      .def("bytes", [](const SourceHandle& h, uint64_t id) { return h.source->bytes(Checked(h, id)); })
      .def("label", [](const SourceHandle& h, uint64_t id) { return h.source->label(Checked(h, id)); })
      .def("describe", [](const SourceHandle& h, uint64_t id) { return h.source->Describe(Checked(h, id)); })
      .def_property_readonly("class_names", [](const SourceHandle& h) { return h.source->class_names(); })
      .def("read", [](const SourceHandle& h, uint64_t id) {
        Checked(h, id);
        ThrowIfError(h.source->Check(id));
        viper::SampleBuffer b = viper::SampleBuffer::Allocate(h.source->bytes(id));
        Status st;
        {
          py::gil_scoped_release release;
          st = h.source->ReadInto(id, {b.data(), b.size()});
        }
        ThrowIfError(st);
        return SampleArray(std::move(b));
      });
  m.def("_open_directory", [](viper::DirectorySourceOptions o, std::vector<std::string> extensions) {
    o.extensions = std::move(extensions);
    viper::Result<std::shared_ptr<const viper::SampleSource>> r = Status::Internal("unset");
    {
      py::gil_scoped_release release;
      r = viper::OpenDirectorySource(o);
    }
    return SourceHandle{Unwrap(std::move(r))};
  });
  m.def("_callable_source", [](py::object read, std::vector<uint64_t> sizes, std::vector<int64_t> labels,
                                std::string name) {
    if (!labels.empty() && labels.size() != sizes.size()) {
      Raise(Status::InvalidArgument("callable_source: " + std::to_string(labels.size()) + " labels for " +
                                    std::to_string(sizes.size()) + " samples"));
    }
    return SourceHandle{std::make_shared<CallableSource>(std::move(read), std::move(sizes), std::move(labels),
                                                         std::move(name))};
  });
  m.def("_open_records", [](const std::string& path) {
    viper::Result<std::shared_ptr<const viper::SampleSource>> r = Status::Internal("unset");
    {
      py::gil_scoped_release release;
      r = viper::OpenRecordSource(path);
    }
    return SourceHandle{Unwrap(std::move(r))};
  });
  py::class_<viper::RecordWriter>(m, "_RecordWriter")
      .def(py::init([](const std::string& path) { return Unwrap(viper::RecordWriter::Create(path)); }))
      .def("append", [](viper::RecordWriter& w, py::buffer b, int64_t label) {
        py::buffer_info info = b.request();
        ThrowIfError(w.Append({static_cast<const std::byte*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)}, label));
      })
      .def("finish", [](viper::RecordWriter& w, py::bytes metadata) {
        std::string m = metadata;
        ThrowIfError(w.Finish(std::as_bytes(std::span(m))));
      })
      .def_property_readonly("records", &viper::RecordWriter::records);
}

// The collaborative sample cache (include/viper/sample_cache.h): a source that wraps another.
struct SampleCacheHandle {
  std::shared_ptr<viper::SampleCache> cache;
  viper::SampleCache& live() const {
    if (!cache) Raise(Status::FailedPrecondition("SampleCache is closed"));
    return *cache;
  }
};

struct JobCountersHandle {
  std::shared_ptr<viper::SampleCacheJobCounters> c;
};

py::dict CacheStatsDict(const viper::SampleCacheStats& s) {
  py::dict d;
  d["source_reads"] = s.source_reads;
  d["source_bytes"] = s.source_bytes;
  d["local_hits"] = s.local_hits;
  d["local_bytes"] = s.local_bytes;
  d["remote_hits"] = s.remote_hits;
  d["remote_bytes"] = s.remote_bytes;
  d["misses"] = s.misses;
  d["puts"] = s.puts;
  d["put_bytes"] = s.put_bytes;
  d["put_failures"] = s.put_failures;
  d["peer_failures"] = s.peer_failures;
  d["node_samples"] = s.node_samples;
  d["node_bytes"] = s.node_bytes;
  d["down"] = s.down;
  return d;
}

void BindSampleCache(py::module_& m) {
  m.def("_sample_owner", [](uint64_t id, const std::vector<std::string>& members) {
    if (members.empty()) Raise(Status::InvalidArgument("sample_owner: members is empty"));
    return viper::SampleOwner(id, members);
  });
  py::class_<JobCountersHandle>(m, "_CacheJobCounters").def("stats", [](const JobCountersHandle& h) {
    py::dict d;
    d["source_reads"] = h.c->source_reads.load();
    d["source_bytes"] = h.c->source_bytes.load();
    d["cache_hits"] = h.c->hits.load();
    d["cache_hit_bytes"] = h.c->hit_bytes.load();
    return d;
  });
  py::class_<SampleCacheHandle>(m, "_SampleCache")
      .def(py::init([](const SourceHandle& src, std::vector<std::string> nodes, size_t self, std::string name,
                       std::string token, bool insecure, uint64_t max_bytes, size_t max_samples, double timeout,
                       double retry_down, bool start_node) {
             viper::SampleCacheOptions o;
             o.nodes = std::move(nodes);
             o.self = self;
             o.name = std::move(name);
             o.token = std::move(token);
             o.insecure = insecure;
             o.max_bytes = max_bytes;
             o.max_samples = max_samples;
             o.timeout = SecondsToMs(timeout, "timeout");
             o.retry_down = SecondsToMs(retry_down, "retry_down");
             o.start_node = start_node;
             viper::Result<std::shared_ptr<viper::SampleCache>> r = Status::Internal("unset");
             {
               py::gil_scoped_release release;
               r = viper::SampleCache::Open(src.source, o);
             }
             return SampleCacheHandle{Unwrap(std::move(r))};
           }),
           py::arg("source"), py::arg("nodes"), py::arg("self"), py::arg("name"), py::arg("token"),
           py::arg("insecure"), py::arg("max_bytes"), py::arg("max_samples"), py::arg("timeout"),
           py::arg("retry_down"), py::arg("start_node"))
      .def_property_readonly("source", [](const SampleCacheHandle& h) { h.live();
        return SourceHandle{h.cache}; })
      .def_property_readonly("address", [](const SampleCacheHandle& h) { return h.live().address(); })
      .def("owner", [](const SampleCacheHandle& h, uint64_t id) { return h.live().OwnerOf(id); })
      .def("stats", [](const SampleCacheHandle& h) { return CacheStatsDict(h.live().stats()); })
      // (segment, offset, nbytes, hold) of a sample cached in this process's node, None if not
      // cached; the bytes stay put until `hold` (a capsule) is garbage-collected.
      .def("pin", [](const SampleCacheHandle& h, uint64_t id) -> py::object {
        viper::SampleCache& c = h.live();
        if (id >= c.size()) Raise(Status::InvalidArgument("pin: sample id " + std::to_string(id) + " out of range"));
        viper::Result<viper::PinnedSample> r = c.Pin(id);
        if (!r.ok() && r.status().code() == viper::StatusCode::kNotFound) return py::none();
        viper::PinnedSample p = Unwrap(std::move(r));
        auto* hold = new std::shared_ptr<const void>(std::move(p.hold));
        py::capsule cap(hold, [](void* q) { delete static_cast<std::shared_ptr<const void>*>(q); });
        return py::make_tuple(p.segment, p.offset, p.nbytes, cap);
      }, py::arg("id"))
      // (source, counters): a source reading through this cache that counts one job's reads.
      .def("job_view", [](const SampleCacheHandle& h) {
        auto counters = std::make_shared<viper::SampleCacheJobCounters>();
        auto view = (h.live(), viper::SampleCache::CountedView(h.cache, counters));
        return py::make_tuple(SourceHandle{std::move(view)}, JobCountersHandle{std::move(counters)});
      })
      .def("put_object", [](const SampleCacheHandle& h, const std::string& key, py::buffer data) {
        py::buffer_info info = data.request();
        std::span<const std::byte> bytes(static_cast<const std::byte*>(info.ptr),
                                         static_cast<size_t>(info.size * info.itemsize));
        std::shared_ptr<viper::SampleCache> c = Held(h.cache, "SampleCache");
        Status st;
        {
          py::gil_scoped_release release;
          st = c->PutObject(key, bytes);
          c.reset();  // the last reference if closed meanwhile: the node stops without the GIL
        }
        ThrowIfError(st);
      }, py::arg("key"), py::arg("data"), "Puts bytes under `key` into this rank's node (SampleCache::PutObject).")
      .def("get_object", [](const SampleCacheHandle& h, size_t node, const std::string& key) -> py::object {
        std::shared_ptr<viper::SampleCache> c = Held(h.cache, "SampleCache");
        viper::Result<std::vector<std::byte>> r = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          r = c->GetObject(node, key);
          c.reset();
        }
        if (!r.ok() && r.status().code() == viper::StatusCode::kNotFound) return py::none();
        std::vector<std::byte> v = Unwrap(std::move(r));
        return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
      }, py::arg("node"), py::arg("key"),
         "The latest bytes under `key` in nodes[node], None if it holds none (SampleCache::GetObject).")
      .def("close", [](SampleCacheHandle& h) {
        std::shared_ptr<viper::SampleCache> c = std::move(h.cache);
        py::gil_scoped_release release;
        c.reset();  // the node stops when the last prefetcher reading through it is gone too
      })
      .def("_abandon", [](SampleCacheHandle& h) {
        (void)new std::shared_ptr<viper::SampleCache>(std::move(h.cache));  // a reference never dropped
      },
           kAbandonDoc);
}

void BindPrefetcher(py::module_& m) {
  BindOptions(m, "_PrefetchOptions", "viper.data.Prefetcher", PrefetchOptionsTable());
  py::class_<PrefetcherHandle>(m, "_Prefetcher")
      .def(py::init([](const SourceHandle& src, viper::PrefetchOptions o, std::vector<uint64_t> ids) {
        o.ids = std::move(ids);
        return PrefetcherHandle(Unwrap(viper::Prefetcher::Start(src.source, o)));
      }))
      .def("next", [](PrefetcherHandle& h, std::optional<double> timeout) -> py::object {
        std::optional<viper::Sample> s = h.Next(timeout);
        return s ? py::object(SampleTuple(std::move(*s))) : py::object(py::none());
      }, py::arg("timeout") = py::none())
      .def("next_batch", [](PrefetcherHandle& h, size_t n, bool stack) -> py::object {
        if (n == 0) Raise(Status::InvalidArgument("next_batch: n must be >= 1"));
        std::vector<viper::Sample> batch = h.Batch(n);
        if (batch.empty()) return py::none();
        if (stack) return StackBatch(std::move(batch));
        py::list out;
        for (auto& s : batch) out.append(SampleTuple(std::move(s)));
        return out;
      }, py::arg("n"), py::arg("stack") = true)
      .def("stats", [](PrefetcherHandle& h) { return StatsDict(h.live().stats()); })
      .def("set_limits", [](PrefetcherHandle& h, size_t max_readers, uint64_t max_buffer_bytes) {
        std::shared_ptr<viper::Prefetcher> p = Held(h.p, "Prefetcher");
        Status st;
        {
          py::gil_scoped_release release;
          st = p->SetLimits(max_readers, max_buffer_bytes);
          p.reset();
        }
        ThrowIfError(st);
      }, py::arg("max_readers"), py::arg("max_buffer_bytes"))
      .def_property_readonly("finished", [](PrefetcherHandle& h) { return h.live().finished(); })
      .def_property_readonly("epoch_size", [](PrefetcherHandle& h) { return h.live().epoch_size(); })
      .def("close", [](PrefetcherHandle& h) {
        std::shared_ptr<viper::Prefetcher> p = std::move(h.p);
        if (!p) return;
        py::gil_scoped_release release;
        p->Close();  // joins the readers; a next() on another thread returns Cancelled
        p.reset();
      })
      .def("_abandon", [](PrefetcherHandle& h) {
        (void)new std::shared_ptr<viper::Prefetcher>(std::move(h.p));  // a reference never dropped
      }, kAbandonDoc);
}

// A call that releases the GIL holds its own reference (Held), so that close() on another thread
// never frees the buffer under it.
struct RehearsalHandle {
  std::shared_ptr<viper::RehearsalBuffer> b;
  viper::RehearsalBuffer& live() const { return *Held(b, "RehearsalBuffer"); }
};

std::span<const std::byte> Bytes(const py::buffer_info& info) {
  return {static_cast<const std::byte*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
}

void BindRehearsal(py::module_& m) {
  BindOptions(m, "_RehearsalOptions", "viper.data.RehearsalBuffer", RehearsalOptionsTable());
  py::class_<RehearsalHandle>(m, "_RehearsalBuffer")
      .def(py::init([](const viper::RehearsalOptions& o) {
        viper::Result<std::unique_ptr<viper::RehearsalBuffer>> r = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          r = viper::RehearsalBuffer::Open(o);
        }
        return RehearsalHandle{Unwrap(std::move(r))};
      }))
      .def("add_rows", [](RehearsalHandle& h, py::buffer rows, std::vector<int64_t> labels) {
        py::buffer_info info = rows.request();
        auto all = Bytes(info);
        size_t n = labels.size();
        if (n == 0) return size_t{0};
        if (all.size() % n != 0) Raise(Status::InvalidArgument("add_rows: the rows' bytes do not split into the labels' count"));
        size_t row = all.size() / n, kept = 0;
        std::shared_ptr<viper::RehearsalBuffer> b = Held(h.b, "RehearsalBuffer");
        Status failed;
        {
          py::gil_scoped_release release;
          for (size_t i = 0; i < n && failed.ok(); ++i) {
            auto r = b->Add(all.subspan(i * row, row), labels[i]);
            if (r.ok()) kept += *r;
            else failed = r.status();
          }
          b.reset();
        }
        ThrowIfError(failed);
        return kept;
      }, "Offers n samples (the rows of a C-contiguous buffer, one per label); returns how many stayed.")
      .def("draw", [](RehearsalHandle& h, size_t k, std::optional<int64_t> label) {
        std::shared_ptr<viper::RehearsalBuffer> b = Held(h.b, "RehearsalBuffer");
        uint64_t sb = b->options().sample_bytes;
        if (sb == 0) Raise(Status::InvalidArgument("draw: needs sample_bytes"));
        size_t population = b->size();
        if (label) {
          auto counts = b->class_counts();
          auto it = counts.find(*label);
          population = it == counts.end() ? 0 : it->second;
        }
        k = std::min(k, population);
        py::array_t<uint8_t> data({k, static_cast<size_t>(sb)});
        py::array_t<int64_t> labels(static_cast<py::ssize_t>(k));
        std::span<std::byte> dst(reinterpret_cast<std::byte*>(data.mutable_data()), k * sb);
        std::span<int64_t> ls(labels.mutable_data(), k);
        viper::Result<size_t> n = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          n = b->DrawInto(k, dst, ls, label);
          b.reset();
        }
        size_t got = Unwrap(std::move(n));
        if (got < k) {  // another thread took samples out meanwhile (evictions): the ones drawn
          data.resize({got, static_cast<size_t>(sb)});
          labels.resize({got});
        }
        return py::make_tuple(data, labels);
      }, py::arg("k"), py::arg("label") = py::none(),
         "k distinct samples drawn uniformly (with label: from that class's samples only).")
      .def("spill", [](RehearsalHandle& h) {
        std::shared_ptr<viper::RehearsalBuffer> b = Held(h.b, "RehearsalBuffer");
        Status st;
        {
          py::gil_scoped_release release;
          st = b->Spill();
          b.reset();
        }
        ThrowIfError(st);
      })
      .def("state", [](const RehearsalHandle& h) {
        viper::RehearsalBufferState st = h.live().State();
        const size_t n = st.samples.size();
        const size_t sb = n ? st.samples[0].bytes->size() : 0;  // sample_bytes is fixed by the Python side
        py::array_t<uint8_t> data({n, sb});
        py::array_t<int64_t> labels(static_cast<py::ssize_t>(n));
        for (size_t i = 0; i < n; ++i) {
          if (st.samples[i].bytes->size() != sb) Raise(Status::Internal("state: samples of different sizes"));
          std::memcpy(data.mutable_data(i, 0), st.samples[i].bytes->data(), sb);
          labels.mutable_at(i) = st.samples[i].label;
        }
        py::dict d;
        d["samples"] = data;
        d["labels"] = labels;
        d["members"] = py::array_t<uint64_t>(static_cast<py::ssize_t>(n), st.members.data());
        d["seen"] = st.seen;
        d["class_seen"] = st.class_seen;
        d["rng"] = st.rng;
        return d;
      }, "The whole state: samples [n, sample_bytes] uint8, labels, members, seen, class_seen, rng.")
      .def("load_state", [](RehearsalHandle& h, py::buffer samples, std::vector<int64_t> labels,
                            std::vector<uint64_t> members, uint64_t seen, std::map<int64_t, uint64_t> class_seen,
                            std::string rng) {
        viper::RehearsalBuffer& b = h.live();
        py::buffer_info info = samples.request();
        auto all = Bytes(info);
        viper::RehearsalBufferState st;
        const size_t n = labels.size();
        if (n == 0 ? !all.empty() : all.size() % n != 0) {
          Raise(Status::InvalidArgument("rehearsal state: the samples' bytes do not split into the labels' count"));
        }
        const size_t row = n ? all.size() / n : 0;
        st.samples.reserve(n);
        for (size_t i = 0; i < n; ++i) {
          auto bytes = std::make_shared<std::vector<std::byte>>(all.begin() + i * row, all.begin() + (i + 1) * row);
          st.samples.push_back({std::move(bytes), labels[i]});
        }
        st.members = std::move(members);
        st.seen = seen;
        st.class_seen = std::move(class_seen);
        st.rng = std::move(rng);
        ThrowIfError(b.LoadState(st));
      }, "Replaces the whole state (see state()); InvalidArgumentError naming what does not fit.")
      .def("close", [](RehearsalHandle& h) {
        std::shared_ptr<viper::RehearsalBuffer> b = std::move(h.b);
        py::gil_scoped_release release;
        b.reset();  // freed here, or by the last call in flight
      }, "Frees the samples (spill() first to keep them).")
      .def("_abandon", [](RehearsalHandle& h) {
        (void)new std::shared_ptr<viper::RehearsalBuffer>(std::move(h.b));  // a reference never dropped
      }, kAbandonDoc)
      .def("__len__", [](const RehearsalHandle& h) { return h.live().size(); })
      .def_property_readonly("seen", [](const RehearsalHandle& h) { return h.live().seen(); })
      .def_property_readonly("class_counts", [](const RehearsalHandle& h) { return h.live().class_counts(); })
      .def_property_readonly("class_seen", [](const RehearsalHandle& h) { return h.live().class_seen(); })
      .def_property_readonly("spill_path", [](const RehearsalHandle& h) { return h.live().spill_path().string(); });
}

}  // namespace

void BindData(py::module_& m) {
  BindSources(m);
  BindSampleCache(m);
  BindPrefetcher(m);
  BindRehearsal(m);
}

}  // namespace viper_py
