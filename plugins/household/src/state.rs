//! The state of a running episode, and the two views of it the kernel sees: the observation
//! text (what the policy reads) and the anchor key (what GiGPO groups by).
//!
//! The text is built to be *Markov*: the goal, where the agent is, what it sees there, what it
//! holds, where it has already seen goal objects (`seen :`) and which plausible places it has
//! not searched yet (`unsearched :`). The expert ([`crate::expert`]) reads only these facts, so
//! its next action is a function of the text; a test checks exactly that.
//!
//! In the knowledge regime ([`Hidden`]) two views change so that neither gives a target's home
//! away: `unsearched :` follows the task's shuffled order instead of plausibility, and the
//! anchor writes a target still lying where it started as `@ start` (within one task, the
//! same physical state as naming the receptacle, so step groups are unchanged).

use crate::catalog::TaskKind;
use crate::world::{with_article, Goal, Layout, Place, Task};

/// What the knowledge regime hides: the data behind its two changed views.
#[derive(Clone, Debug)]
pub(crate) struct Hidden {
    /// Per receptacle, its rank in the `unsearched :` list ([`crate::world::Task::search_rank`]).
    pub search_rank: Vec<u32>,
    /// Per object, where it started (index-aligned with [`Layout::objects`]).
    pub start: Vec<Place>,
}

/// The full state of an episode (everything that changes, plus the layout it started from).
#[derive(Clone, Debug)]
pub(crate) struct State {
    /// The room; objects move and change state in place.
    pub layout: Layout,
    pub goal: Goal,
    /// The receptacle the agent stands at; `None` in the middle of the room (the start).
    pub location: Option<usize>,
    /// Per receptacle: open (surfaces count as closed; they need no opening).
    pub open: Vec<bool>,
    /// Per receptacle: the agent has seen its contents.
    pub searched: Vec<bool>,
    /// Per object: the agent knows where it is (it saw it, or put it there).
    pub known: Vec<bool>,
    /// A light task's target was examined under the lamp.
    pub examined: bool,
    /// The knowledge regime's hidden facts; `None` outside it.
    pub hidden: Option<Hidden>,
}

impl State {
    pub fn new(task: &Task) -> State {
        let n = task.layout.receptacles.len();
        State {
            layout: task.layout.clone(),
            goal: task.goal,
            location: None,
            open: vec![false; n],
            searched: vec![false; n],
            known: vec![false; task.layout.objects.len()],
            examined: false,
            hidden: task.search_rank.as_ref().map(|rank| Hidden {
                search_rank: rank.clone(),
                start: task.layout.objects.iter().map(|o| o.place).collect(),
            }),
        }
    }

    pub fn holding(&self) -> Option<usize> {
        self.layout
            .objects
            .iter()
            .position(|o| o.place == Place::Held)
    }

    /// Whether the contents of receptacle `r` can be seen (and reached) from in front of it.
    pub fn reachable(&self, r: usize) -> bool {
        !self.layout.receptacles[r].kind.openable() || self.open[r]
    }

    /// The location, if the agent stands at a receptacle whose contents it can see.
    pub fn here_visible(&self) -> Option<usize> {
        self.location.filter(|&r| self.reachable(r))
    }

    /// Objects in or on receptacle `r`, in listing order.
    pub fn contents(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.layout.objects.len())
            .filter(move |&o| self.layout.objects[o].place == Place::At(r))
    }

    /// Marks what the agent sees now as searched and known. Called after every action.
    pub fn observe(&mut self) {
        if let Some(r) = self.here_visible() {
            self.searched[r] = true;
            for o in self.contents(r).collect::<Vec<_>>() {
                self.known[o] = true;
            }
        }
        if let Some(h) = self.holding() {
            self.known[h] = true;
        }
    }

    /// A target-kind object that still has to be dealt with (not already counted as done).
    pub fn wanted(&self, o: usize) -> bool {
        let object = &self.layout.objects[o];
        object.kind == self.goal.target && !self.goal.satisfied_by(object)
    }

    /// Wanted objects the agent sees right here, in listing order.
    pub fn wanted_here(&self) -> Vec<usize> {
        match self.here_visible() {
            Some(r) => self.contents(r).filter(|&o| self.wanted(o)).collect(),
            None => Vec::new(),
        }
    }

    /// Wanted objects the agent knows about but cannot see from here: `(object, receptacle)`.
    pub fn seen_elsewhere(&self) -> Vec<(usize, usize)> {
        let here = self.here_visible();
        (0..self.layout.objects.len())
            .filter(|&o| self.known[o] && self.wanted(o))
            .filter_map(|o| match self.layout.objects[o].place {
                Place::At(r) if Some(r) != here => Some((o, r)),
                _ => None,
            })
            .collect()
    }

    pub fn satisfied(&self) -> usize {
        self.layout
            .objects
            .iter()
            .filter(|o| self.goal.satisfied_by(o))
            .count()
    }

    pub fn solved(&self) -> bool {
        match self.goal.kind {
            TaskKind::LookAtObjInLight => self.examined,
            kind => self.satisfied() >= kind.needed(),
        }
    }

    /// Whether the agent still has to find target objects it does not know of.
    pub fn searching(&self) -> bool {
        let known_wanted = (0..self.layout.objects.len())
            .filter(|&o| self.known[o] && self.wanted(o))
            .count();
        self.satisfied() + known_wanted < self.goal.kind.needed()
    }

    /// Plausible places for the target not searched yet, best first: by plausibility weight,
    /// then canonical order; in the knowledge regime, in the task's shuffled order instead (a
    /// best-first order would rank the home by a weight the home does not follow). The
    /// destination is left out (a target never starts there).
    pub fn unsearched(&self) -> Vec<usize> {
        let target = &crate::catalog::OBJECTS[self.goal.target];
        let mut places: Vec<usize> = (0..self.layout.receptacles.len())
            .filter(|&r| !self.searched[r] && Some(r) != self.goal.destination)
            .filter(|&r| target.weight_in(self.layout.receptacles[r].kind) > 0)
            .collect();
        match &self.hidden {
            Some(hidden) => places.sort_by_key(|&r| hidden.search_rank[r]),
            None => places.sort_by_key(|&r| {
                let weight = target.weight_in(self.layout.receptacles[r].kind);
                (std::cmp::Reverse(weight), r)
            }),
        }
        places
    }

    /// A potential that grows as the task advances: 3 per object done, plus 1 for holding a
    /// wanted object and 1 more if it already has the required state (light tasks: 1 for
    /// holding the target). Feedback is +1 when it grows.
    pub fn progress(&self) -> u32 {
        let held = self.holding().filter(|&h| self.wanted(h));
        let holding_score = held.map_or(0, |h| {
            let extra = self.goal.kind.appliance().is_some()
                && self.goal.state_met(&self.layout.objects[h]);
            1 + u32::from(extra)
        });
        3 * self.satisfied() as u32 + holding_score + 4 * u32::from(self.examined)
    }

    fn rec(&self, r: usize) -> String {
        self.layout.receptacles[r].name()
    }

    /// The observation text (without an event prefix such as `nothing happens .`).
    pub fn render(&self) -> String {
        let layout = &self.layout;
        let mut text = format!("task : {} .", self.goal.text(layout));
        match self.location {
            None => text.push_str(&format!(" you are in the {} .", layout.room.name())),
            Some(r) => {
                text.push_str(&format!(" you are at {} .", self.rec(r)));
                if self.reachable(r) {
                    let mut things: Vec<String> = self
                        .contents(r)
                        .map(|o| with_article(&layout.objects[o].description()))
                        .collect();
                    if layout.lamp == Some(r) {
                        things.push("a desklamp 1".into());
                    }
                    let list = if things.is_empty() {
                        "nothing".into()
                    } else {
                        things.join(" , ")
                    };
                    let prep = layout.receptacles[r].kind.preposition();
                    text.push_str(&format!(" {prep} it you see {list} ."));
                } else {
                    text.push_str(" it is closed .");
                }
            }
        }
        match self.holding() {
            Some(h) => text.push_str(&format!(
                " you hold {} .",
                with_article(&layout.objects[h].description())
            )),
            None => text.push_str(" you hold nothing ."),
        }
        let mut seen: Vec<String> = self
            .seen_elsewhere()
            .into_iter()
            .map(|(o, r)| format!("{} at {}", layout.objects[o].description(), self.rec(r)))
            .collect();
        if self.goal.kind == TaskKind::LookAtObjInLight {
            if let Some(l) = layout.lamp.filter(|&l| self.location != Some(l)) {
                seen.push(format!("desklamp 1 at {}", self.rec(l)));
            }
        }
        if !seen.is_empty() {
            text.push_str(&format!(" seen : {} .", seen.join(" , ")));
        }
        if self.searching() {
            let places: Vec<String> = self.unsearched().into_iter().map(|r| self.rec(r)).collect();
            if !places.is_empty() {
                text.push_str(&format!(" unsearched : {} .", places.join(" , ")));
            }
        }
        text
    }

    /// The anchor-state key: the physical state that matters for the goal, without history
    /// (no searched set, no turn count). Location and whether it is open, what is held, where
    /// each target-kind object is and in which state, and whether the destination is open.
    pub fn anchor(&self) -> String {
        let layout = &self.layout;
        let mut key = match self.location {
            None => "at middle".to_string(),
            Some(r) if self.reachable(r) => format!("at {}", self.rec(r)),
            Some(r) => format!("at {} closed", self.rec(r)),
        };
        match self.holding() {
            Some(h) => key.push_str(&format!(" ; hold {}", layout.objects[h].description())),
            None => key.push_str(" ; hold nothing"),
        }
        for (i, o) in layout.objects.iter().enumerate() {
            if o.kind != self.goal.target {
                continue;
            }
            let at_start = self.hidden.as_ref().is_some_and(|h| h.start[i] == o.place);
            match o.place {
                Place::At(_) if at_start => {
                    key.push_str(&format!(" ; {} @ start", o.description()))
                }
                Place::At(r) => key.push_str(&format!(" ; {} @ {}", o.description(), self.rec(r))),
                Place::Held => {}
            }
        }
        if let Some(d) = self
            .goal
            .destination
            .filter(|&d| layout.receptacles[d].kind.openable())
        {
            key.push_str(if self.open[d] {
                " ; dest open"
            } else {
                " ; dest closed"
            });
        }
        if self.examined {
            key.push_str(" ; examined");
        }
        key
    }
}
