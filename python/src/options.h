// Options structs as Python classes built from keyword arguments, from one table per struct.
//
// The C++ struct is the one table of names and defaults, shared by C++, CLI flags and Python
// keyword arguments: an OptionsTable lists its fields once (name, how a Python value sets it, how
// it reads back, a doc line); BindOptions makes
// a Python class whose constructor takes keyword arguments only, each setting the field of that
// name, every other field keeping the struct's default. A table can include another struct's table
// for a member (PublisherOptions includes the node's), so the node's keywords are defined once for
// viper.Node and viper.Publisher. An unknown keyword raises TypeError naming it, a value of the
// wrong type TypeError naming the option, a value the option refuses InvalidArgumentError.
// REQUIRES: the GIL is held (all of it runs while Python constructs the options).
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bindings.h"

namespace viper_py {

// Thrown by a field's setter for an int outside its C++ type's range (one type for every table,
// so that an included table's refusal reaches the outer FromKeywords).
struct OptionOutOfRange {
  std::string rule;
};

template <typename Options>
class OptionsTable {
 public:
  struct Field {
    std::string name, doc;
    std::string expected;  // what a value must be, for TypeError messages
    std::function<void(Options&, py::handle)> set;
    std::function<py::object(const Options&)> get;
  };

  // A field Python passes as its C++ type (str, int, bool). A str field takes str only (not
  // bytes); an int field takes an int (not a bool) and refuses one outside the C++ type's range
  // with InvalidArgumentError naming the option, the value and the range.
  template <typename T>
  OptionsTable& Plain(const char* name, T Options::*member, const char* doc) {
    std::string field = name;
    return Add(name, doc, Expected<T>(), [member, field](Options& o, py::handle v) { o.*member = Checked<T>(field, v); },
               [member](const Options& o) { return py::cast(o.*member); });
  }
  // A path: a str or an os.PathLike whose __fspath__ is a str (pathlib.Path works).
  OptionsTable& Path(const char* name, std::filesystem::path Options::*member, const char* doc) {
    return Add(name, doc, "a str or os.PathLike path", [member, field = std::string(name)](Options& o, py::handle v) {
                 py::object p = py::reinterpret_borrow<py::object>(v);
                 if (!PyUnicode_Check(p.ptr()) && py::hasattr(p, "__fspath__")) p = p.attr("__fspath__")();
                 o.*member = Checked<std::string>(field, p);
               },
               [member](const Options& o) { return py::cast((o.*member).string()); });
  }
  // A list of str (a list or a tuple; a lone str is refused, not taken as its characters).
  OptionsTable& Strings(const char* name, std::vector<std::string> Options::*member, const char* doc) {
    return Add(name, doc, "a list of str", [member, field = std::string(name)](Options& o, py::handle v) {
                 if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) throw py::cast_error(field);
                 std::vector<std::string> items;
                 for (py::handle item : py::reinterpret_borrow<py::sequence>(v)) items.push_back(Checked<std::string>(field, item));
                 o.*member = std::move(items);
               },
               [member](const Options& o) { return py::cast(o.*member); });
  }
  // A duration: seconds (float) in Python, milliseconds in C++.
  OptionsTable& Seconds(const char* name, std::chrono::milliseconds Options::*member, const char* doc) {
    std::string what = name;
    return Add(name, doc, "a number of seconds", [member, what](Options& o, py::handle v) {
                 if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()))) throw py::cast_error(what);
                 const double s = v.cast<double>();
                 if (!std::isfinite(s) || s < 0 || s > 9.0e9) throw OptionOutOfRange{"a finite number of seconds from 0 to 9e9"};
                 o.*member = SecondsToMs(s, what.c_str());
               },
               [member](const Options& o) { return py::cast(std::chrono::duration<double>(o.*member).count()); });
  }
  // An enum named by a string: `parse` refuses unknown names (InvalidArgumentError).
  template <typename E, typename Parse, typename Name>
  OptionsTable& Named(const char* name, E Options::*member, Parse parse, Name to_name, const char* doc) {
    std::string field = name;
    return Add(name, doc, "a str", [member, parse, field](Options& o, py::handle v) { o.*member = Unwrap(parse(Checked<std::string>(field, v))); },
               [member, to_name](const Options& o) { return py::cast(std::string(to_name(o.*member))); });
  }
  // Every field of `inner` as a field of this struct's `member` (same keyword names).
  template <typename Inner>
  OptionsTable& Include(Inner Options::*member, const OptionsTable<Inner>& inner) {
    for (const auto& f : inner.fields()) {
      Add(f.name.c_str(), f.doc.c_str(), f.expected, [member, set = f.set](Options& o, py::handle v) { set(o.*member, v); },
          [member, get = f.get](const Options& o) { return get(o.*member); });
    }
    return *this;
  }

  const std::vector<Field>& fields() const { return fields_; }

  // The struct with every keyword of `kwargs` set. `owner` names the Python callable in errors.
  Options FromKeywords(const py::kwargs& kwargs, const std::string& owner) const {
    Options o;
    for (auto [key, value] : kwargs) {
      std::string k = py::str(key);
      const Field* f = Find(k);
      if (f == nullptr) {
        PyErr_SetString(PyExc_TypeError, (owner + "() got an unexpected keyword argument '" + k + "'").c_str());
        throw py::error_already_set();
      }
      try {
        f->set(o, value);
      } catch (const OptionOutOfRange& range) {
        Raise(viper::Status::InvalidArgument(owner + "(): " + k + "=" + ShortRepr(value) + ": must be " + range.rule));
      } catch (const py::cast_error&) {
        PyErr_SetString(PyExc_TypeError, (owner + "(): " + k + "=" + ShortRepr(value) + ": expected " + f->expected +
                                          ", got " + std::string(py::str(py::type::handle_of(value).attr("__name__"))))
                                             .c_str());
        throw py::error_already_set();
      }
    }
    return o;
  }

  // "name (default): doc" lines, for docstrings.
  std::string Doc() const {
    Options defaults;
    std::string out;
    for (const auto& f : fields_) out += "  " + f.name + " (" + std::string(py::repr(f.get(defaults))) + "): " + f.doc + "\n";
    return out;
  }

 private:
  // repr(value) cut to 60 characters (a tensor passed by mistake is not printed whole).
  static std::string ShortRepr(py::handle value) {
    std::string r = py::repr(value);
    return r.size() > 60 ? r.substr(0, 60) + "..." : r;
  }
  template <typename T>
  static T Checked(const std::string& field, py::handle v) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (!PyUnicode_Check(v.ptr())) throw py::cast_error(field);
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (PyBool_Check(v.ptr()) || !PyLong_Check(v.ptr())) throw py::cast_error(field);
      py::int_ lo(std::numeric_limits<T>::min()), hi(std::numeric_limits<T>::max());
      if (v < lo || v > hi) throw OptionOutOfRange{"an int from " + std::to_string(std::numeric_limits<T>::min()) + " to " +
                                             std::to_string(std::numeric_limits<T>::max())};
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!PyBool_Check(v.ptr())) throw py::cast_error(field);
    }
    return v.cast<T>();
  }
  template <typename T>
  static std::string Expected() {
    if constexpr (std::is_same_v<T, bool>) return "a bool";
    else if constexpr (std::is_unsigned_v<T>) return "an int >= 0";
    else if constexpr (std::is_integral_v<T>) return "an int";
    else if constexpr (std::is_floating_point_v<T>) return "a float";
    else return "a str";
  }
  OptionsTable& Add(const char* name, const char* doc, std::string expected, std::function<void(Options&, py::handle)> set,
                    std::function<py::object(const Options&)> get) {
    fields_.push_back({name, doc, std::move(expected), std::move(set), std::move(get)});
    return *this;
  }
  const Field* Find(const std::string& name) const {
    for (const auto& f : fields_)
      if (f.name == name) return &f;
    return nullptr;
  }
  std::vector<Field> fields_;
};

// The Python class `name` for Options: constructed from keyword arguments only (`owner` names the
// public callable in errors), each field a read-only property, the docstring listing the
// keywords with their defaults.
template <typename Options>
py::class_<Options> BindOptions(py::module_& m, const char* name, const char* owner, OptionsTable<Options> table) {
  auto shared = std::make_shared<OptionsTable<Options>>(std::move(table));
  std::string doc = std::string("Keyword arguments of ") + owner + " (default):\n" + shared->Doc();
  py::class_<Options> cls(m, name);
  cls.doc() = doc;
  cls.def(py::init([shared, owner = std::string(owner)](const py::kwargs& kwargs) {
    return shared->FromKeywords(kwargs, owner);
  }));
  for (const auto& f : shared->fields())
    cls.def_property_readonly(f.name.c_str(), [get = f.get](const Options& o) { return get(o); }, f.doc.c_str());
  return cls;
}

}  // namespace viper_py
