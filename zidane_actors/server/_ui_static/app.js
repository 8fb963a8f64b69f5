// The session browser's only script: fetch this page's HTML fragment with the
// bearer token (asked for once, kept in sessionStorage, never put in a URL),
// show it, and re-fetch it while the session is running.
(function () {
  "use strict";
  var KEY = "zidane-actors.token";
  var main = document.getElementById("app");
  var lastText = null;
  var timer = null;

  function fragmentUrl() {
    var path = location.pathname;
    var rest = path === "/ui/" || path === "/ui" ? "sessions" : path.slice("/ui/".length);
    return "/ui/fragments/" + rest + location.search;
  }

  function setState(state) {
    document.body.setAttribute("data-state", state);
  }

  function message(text) {
    var p = document.createElement("p");
    p.className = "notice";
    p.textContent = text;
    main.replaceChildren(p);
  }

  function askToken(problem) {
    var form = document.createElement("form");
    form.className = "token-form";
    var heading = document.createElement("h1");
    heading.textContent = "This server needs its access token";
    form.appendChild(heading);
    if (problem) {
      var warn = document.createElement("p");
      warn.className = "notice";
      warn.textContent = problem;
      form.appendChild(warn);
    }
    var label = document.createElement("label");
    label.textContent = "Token ";
    var input = document.createElement("input");
    input.type = "password";
    input.name = "token";
    input.id = "token-input";
    input.autocomplete = "off";
    input.required = true;
    label.appendChild(input);
    form.appendChild(label);
    var button = document.createElement("button");
    button.type = "submit";
    button.textContent = "Open";
    form.appendChild(button);
    var note = document.createElement("p");
    note.className = "muted";
    note.textContent = "Kept in this tab's session storage only.";
    form.appendChild(note);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      load(false);
    });
    main.replaceChildren(form);
    setState("token");
    input.focus();
  }

  function openDetails() {
    var open = {};
    main.querySelectorAll("details[open]").forEach(function (d) {
      var turn = d.closest("[data-turn-id]");
      var index = Array.prototype.indexOf.call(main.querySelectorAll("details"), d);
      open[(turn ? turn.getAttribute("data-turn-id") : "") + "#" + index] = true;
    });
    return open;
  }

  // Scroll to an element, opening the folds (closed <details>) it sits in first.
  function reveal(target) {
    for (var up = target && target.parentElement; up; up = up.parentElement) {
      if (up.tagName === "DETAILS") up.open = true;
    }
    if (target) target.scrollIntoView();
  }

  window.addEventListener("hashchange", function () {
    var id = location.hash.slice(1);
    try { id = decodeURIComponent(id); } catch (e) { /* keep it raw */ }
    if (id) reveal(document.getElementById(id));
  });

  function newestTurnInView() {
    var turns = main.querySelectorAll(".turn");
    if (!turns.length) return true;
    var box = turns[turns.length - 1].getBoundingClientRect();
    return box.top < window.innerHeight && box.bottom > 0;
  }

  function show(text) {
    var following = lastText === null || newestTurnInView();
    var open = openDetails();
    var doc = new DOMParser().parseFromString(text, "text/html");
    main.replaceChildren.apply(main, Array.prototype.slice.call(doc.body.childNodes));
    main.querySelectorAll("details").forEach(function (d, index) {
      var turn = d.closest("[data-turn-id]");
      if (open[(turn ? turn.getAttribute("data-turn-id") : "") + "#" + index]) d.open = true;
    });
    var root = main.firstElementChild;
    if (following && root && root.getAttribute("data-poll") && !location.hash) {
      // A live tail: a running session follows its newest turn unless the reader scrolled up.
      var turns = main.querySelectorAll(".turn");
      if (turns.length) turns[turns.length - 1].scrollIntoView({ block: "end" });
    }
    var title = root && root.getAttribute("data-title");
    document.title = title ? title + " · zidane-actors" : "zidane-actors";
    if (!lastText) {
      // The anchor of the URL, else the turn a ?turn= link opened the page at (inside a
      // fold's originals, the fold opened first).
      var target = main.querySelector(".turn.target");
      if (location.hash) {
        var id = location.hash.slice(1);
        try { id = decodeURIComponent(id); } catch (e) { /* keep it raw */ }
        target = document.getElementById(id);
      }
      reveal(target);
    }
  }

  function schedule() {
    var root = main.firstElementChild;
    var every = root && Number(root.getAttribute("data-poll"));
    if (every > 0) {
      timer = setTimeout(function () {
        if (document.hidden) schedule(); // no polling from a background tab
        else load(true);
      }, every);
    }
  }

  function forgetButton() {
    var old = document.getElementById("forget-token");
    if (old) old.remove();
    if (!sessionStorage.getItem(KEY)) return;
    var button = document.createElement("button");
    button.type = "button";
    button.id = "forget-token";
    button.className = "link";
    button.textContent = "Forget token";
    button.addEventListener("click", function () {
      sessionStorage.removeItem(KEY);
      location.reload();
    });
    document.querySelector("header.top").appendChild(button);
  }

  function load(polling) {
    clearTimeout(timer);
    var headers = { Accept: "text/html" };
    var token = sessionStorage.getItem(KEY);
    if (token) headers.Authorization = "Bearer " + token;
    fetch(fragmentUrl(), { headers: headers, credentials: "omit", cache: "no-store" })
      .then(function (response) {
        if (response.status === 401) {
          if (token) sessionStorage.removeItem(KEY);
          askToken(token ? "That token was refused." : null);
          return null;
        }
        var type = response.headers.get("content-type") || "";
        if (type.indexOf("text/html") !== 0) {
          if (polling) {
            // A passing error (a 503 at a limit) keeps the live page and its polling.
            setState("offline");
            schedule();
            return null;
          }
          message("The server answered " + response.status + " " + response.statusText + ".");
          setState("ready");
          return null;
        }
        return response.text().then(function (text) {
          if (text !== lastText) {
            show(text);
            lastText = text;
          }
          if (!polling) forgetButton();
          setState(polling ? "refreshed" : "ready");
          schedule();
        });
      })
      .catch(function () {
        if (!polling) message("The server could not be reached.");
        setState("offline");
        schedule();
      });
  }

  // "show all" / "show more": fetch the rest of a long text (with the token) in place.
  main.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("a.show-all[data-more]");
    if (!link) return;
    event.preventDefault();
    var headers = { Accept: "text/html" };
    var token = sessionStorage.getItem(KEY);
    if (token) headers.Authorization = "Bearer " + token;
    link.textContent = "loading…";
    fetch(link.getAttribute("data-more"), { headers: headers, credentials: "omit" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { link.textContent = "could not load the rest"; return; }
        var doc = new DOMParser().parseFromString(text, "text/html");
        link.replaceWith.apply(link, Array.prototype.slice.call(doc.body.childNodes));
      })
      .catch(function () { link.textContent = "could not load the rest"; });
  });

  load(false);
})();
